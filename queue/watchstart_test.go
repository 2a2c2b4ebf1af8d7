package queue

import (
	"context"
	"sync"
	"testing"
	"time"
)

// TestLossSeenWhenWatchOpensLate revokes a worker's lease while its task
// runs and before its watches are set up (a hook holds them until the
// revoke is done): the watches start after a revision read before the
// first claim, so the claim's deletion still cancels the task's context,
// long before the lease's next renewal (a third of its 30 s TTL) would
// find it gone.
func TestLossSeenWhenWatchOpensLate(t *testing.T) {
	e := newReviewEnv(t).space(t)
	release := make(chan struct{})
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	defer let()
	hook := func() { <-release }
	testHookWatchOpen.Store(&hook)
	defer testHookWatchOpen.Store(nil)
	e.submitSegment(t, "late", 1)
	w := e.worker(t, WorkerConfig{Concurrency: 1, TTL: 30 * time.Second})
	started := make(chan context.Context, 1)
	w.HandleAll(func(hctx context.Context, _ *Task) ([]byte, error) {
		started <- hctx
		<-hctx.Done()
		return nil, hctx.Err()
	})
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = w.Run(ctx); close(ran) }()
	defer func() { let(); stop(); <-ran }()
	var hctx context.Context
	select {
	case hctx = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("the task did not start within 10 s")
	}
	began := time.Now()
	if _, err := e.cli.Revoke(context.Background(), w.Lease().ID()); err != nil {
		t.Fatal(err)
	}
	let() // the watches open now, after the revoke
	select {
	case <-hctx.Done():
		t.Logf("task cancelled %s after the loss", time.Since(began).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Fatal("task not cancelled 5 s after its lease was revoked (the lease's renewal comes at 10 s)")
	}
}
