package queue

import (
	"context"
	"testing"
	"time"
)

// TestLossSeenWhenWatchOpensLate revokes a worker's lease while its task
// runs and before its watches are set up (a hook holds them 500 ms): the
// watches start after a revision read before the first claim, so the
// claim's deletion still cancels the task's context within 1 s, where the
// lease's next renewal would take 1.7 s.
func TestLossSeenWhenWatchOpensLate(t *testing.T) {
	e := newReviewEnv(t).space(t)
	hook := func() { time.Sleep(500 * time.Millisecond) }
	testHookWatchOpen.Store(&hook)
	defer testHookWatchOpen.Store(nil)
	e.submitSegment(t, "late", 1)
	w := e.worker(t, WorkerConfig{Concurrency: 1, TTL: 5 * time.Second})
	started := make(chan context.Context, 1)
	w.HandleAll(func(hctx context.Context, _ *Task) ([]byte, error) {
		started <- hctx
		<-hctx.Done()
		return nil, hctx.Err()
	})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = w.Run(ctx); close(ran) }()
	defer func() { stop(); <-ran }()
	var hctx context.Context
	select {
	case hctx = <-started:
	case <-time.After(5 * time.Second):
		t.Fatal("the task did not start within 5 s")
	}
	began := time.Now()
	if _, err := e.cli.Revoke(context.Background(), w.Lease().ID()); err != nil {
		t.Fatal(err)
	}
	if time.Since(began) > 300*time.Millisecond {
		t.Skip("the revoke took past the watches' delay: the test proves nothing on this run")
	}
	select {
	case <-hctx.Done():
		t.Logf("task cancelled %s after the loss", time.Since(began).Round(time.Millisecond))
	case <-time.After(time.Second):
		t.Fatal("task not cancelled 1 s after its lease was revoked")
	}
}
