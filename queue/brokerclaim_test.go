package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
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

// TestLostClaimResolved: a claim whose answer was lost (the connection to
// the leader broke) is settled by one transaction. Applied, its run is
// adopted (its tasks run here, not stuck RUNNING under a live worker's
// lease); not applied, a try is written in its stead, so that the request,
// should it arrive late, is refused; either way the late request is
// refused, and the tasks end up claimed once.
func TestLostClaimResolved(t *testing.T) {
	ctx := context.Background()
	for _, applied := range []bool{true, false} {
		c, cli := newClient(t, etcdtest.Namespace(t))
		submitN(t, c, "lost", 4, nil)
		l := grantLease(t, cli, 30*time.Second)
		adopted, late, err := queue.LostClaim(ctx, c, "lost", l, applied)
		if err != nil {
			t.Fatal(err)
		}
		st, err := c.Stats(ctx, "lost")
		if err != nil {
			t.Fatal(err)
		}
		want, running := 0, int64(0)
		if applied {
			want, running = 2, 2
		}
		if adopted != want || late || st.Running != running || st.Pending != 4-running {
			t.Fatalf("applied %t: adopted %d (want %d), late request applied %t, stats %+v", applied, adopted, want, late, st)
		}
		// The rest is claimable as usual; a slot the lost claim would
		// have taken counts the attempt it would have started.
		ts, err := c.Claim(ctx, "lost", queue.ClaimRequest{Lease: l, Worker: "w", Max: 4})
		if err != nil || int64(len(ts)) != 4-running {
			t.Fatalf("applied %t: claimed %d, %v", applied, len(ts), err)
		}
	}
}

// TestOutcomeUnknown: the errors after which a claim may have been applied
// (a broken connection, a leader change, a timeout) are told from etcd's
// answers (a lease not found, no space), which apply nothing.
func TestOutcomeUnknown(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{rpctypes.ErrLeaseNotFound, false},
		{fmt.Errorf("wrapped: %w", rpctypes.ErrLeaseNotFound), false},
		{rpctypes.ErrNoSpace, false},
		{rpctypes.ErrLeaderChanged, true},
		{rpctypes.ErrTimeout, true},
		{status.Error(codes.Unavailable, "error reading from server: connection reset by peer"), true},
		{context.DeadlineExceeded, true},
		{errors.New("anything else"), false},
	} {
		if got := queue.OutcomeUnknown(c.err); got != c.want {
			t.Errorf("%v: %t, want %t", c.err, got, c.want)
		}
	}
}
