package queue_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestClaimsCombined: sixteen sessions claim from one queue at the same
// time through one Client, as the HTTP API's sessions do, and ack what they
// get. Claims that arrive together are combined (each session's run in a
// segment of its own, each bound to its own lease), and still every task is
// claimed by one session only and acked once, and the stats count every
// task succeeded.
func TestClaimsCombined(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	const total, sessions = 1000, 16
	submitN(t, c, "comb", total, nil)
	var mu sync.Mutex
	claimedBy := map[string]int{} // task id -> the session that claimed it
	acked := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for s := 0; s < sessions; s++ {
		l := grantLease(t, cli, 30*time.Second)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for empty := 0; empty < 3; {
				ts, err := c.Claim(ctx, "comb", queue.ClaimRequest{Lease: l, Worker: "w", Max: 8, Wait: 50 * time.Millisecond})
				if err != nil {
					errs <- err
					return
				}
				if len(ts) == 0 {
					empty++
					continue
				}
				var os []queue.Outcome
				mu.Lock()
				for _, tk := range ts {
					if prev, ok := claimedBy[tk.ID]; ok {
						t.Errorf("task %s claimed by session %d, then by session %d", tk.ID, prev, s)
					}
					claimedBy[tk.ID] = s
					os = append(os, queue.Outcome{Held: held("comb", tk, l)})
				}
				mu.Unlock()
				rs, err := c.Report(ctx, os)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, r := range rs {
					if r.Err != nil {
						t.Errorf("ack of %s: %v", os[i].ID, r.Err)
						continue
					}
					acked[os[i].ID]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(acked) != total {
		t.Fatalf("%d tasks acked, want %d", len(acked), total)
	}
	for id, n := range acked {
		if n != 1 {
			t.Fatalf("task %s acked %d times", id, n)
		}
	}
	st, err := c.Stats(ctx, "comb")
	if err != nil || st.Succeeded != total || st.Total() != total {
		t.Fatalf("stats %+v, %v: want %d succeeded", st, err, total)
	}
	rounds, served := queue.CombinedClaims(c)
	t.Logf("%d combined claims served %d claims", rounds, served)
	if rounds == 0 || served <= rounds {
		t.Fatalf("%d combined claims served %d claims: want some, each serving more than one", rounds, served)
	}
}
