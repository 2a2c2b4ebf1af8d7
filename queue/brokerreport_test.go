package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
)

// TestReportsCombined acks tasks claimed by many sessions all at once: each
// ack is answered on its own and every task ends SUCCEEDED once, the acks
// are written in fewer reports than there were acks, and the same claim
// acked twice at once counts once.
func TestReportsCombined(t *testing.T) {
	c, cli := newClient(t, etcdtest.Namespace(t))
	const n = 40
	submitN(t, c, "q", n, nil)
	ctx := context.Background()
	held := make([]queue.Held, n)
	for i := range held {
		l := grantLease(t, cli, 30*time.Second)
		ts, err := c.Claim(ctx, "q", queue.ClaimRequest{Lease: l, Worker: fmt.Sprintf("w%d", i), Max: 1})
		if err != nil || len(ts) != 1 {
			t.Fatalf("claim %d: %v %v", i, ts, err)
		}
		held[i] = queue.Held{Queue: "q", ID: ts[0].ID, Token: ts[0].Token, Lease: l.ID()}
	}
	start := make(chan struct{})
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := 0; i <= n; i++ {
		h := held[i%n] // the last one acks the first claim a second time
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			var got *queue.Task
			got, errs[i] = c.Ack(ctx, h, []byte(`"ok"`))
			if errs[i] == nil && got.CurrentStatus != queue.Succeeded {
				errs[i] = fmt.Errorf("ack of %s left it %s", h.ID, got.CurrentStatus)
			}
		}()
	}
	close(start)
	wg.Wait()
	fenced := 0
	for i, err := range errs {
		switch {
		case errors.Is(err, lease.ErrFenced) && (i == 0 || i == n):
			fenced++
		case err != nil:
			t.Fatalf("ack %d: %v", i, err)
		}
	}
	if fenced != 1 {
		t.Fatalf("the claim acked twice at once was refused %d times, want once", fenced)
	}
	st, err := c.Stats(ctx, "q")
	if err != nil {
		t.Fatal(err)
	}
	if st.Succeeded != n {
		t.Fatalf("succeeded %d, want %d", st.Succeeded, n)
	}
	writes, reports := queue.CombinedReports(c)
	t.Logf("%d acks written in %d reports", reports, writes)
	if reports != n+1 || writes >= reports {
		t.Fatalf("%d acks in %d writes: want all %d acks written, fewer writes than acks", reports, writes, n+1)
	}
}
