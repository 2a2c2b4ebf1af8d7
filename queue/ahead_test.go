package queue_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/etcdtest"
	"github.com/droverhq/drover/queue"
)

// runCounted runs n tasks through one worker at concurrency 4 whose handler
// takes d, and returns the most handlers that ran at once and the most
// tasks the queue showed RUNNING (claimed, or finished with the outcome
// not yet written) at once.
func runCounted(t *testing.T, n, prefetch int, d time.Duration) (handlers, claimed int64) {
	t.Helper()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	q := "ahead"
	submitN(t, c, q, n, nil)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 4, Prefetch: prefetch, Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	var now, most atomic.Int64
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		k := now.Add(1)
		for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
		}
		time.Sleep(d)
		now.Add(-1)
		return nil, nil
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var peak int64
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			st, _ := c.Stats(ctx, q)
			if st.Succeeded != int64(n) {
				t.Fatalf("stats %+v, want %d succeeded", st, n)
			}
			return most.Load(), peak
		case <-time.After(20 * time.Millisecond):
			if st, err := c.Stats(ctx, q); err == nil {
				peak = max(peak, st.Running)
			}
		}
	}
}

// Short tasks are claimed ahead of a free running slot (claims' round
// trips overlap the work), but never more run at once than the
// concurrency.
func TestShortTasksClaimedAheadRunWithinConcurrency(t *testing.T) {
	handlers, claimed := runCounted(t, 400, 4, 2*time.Millisecond)
	if handlers > 4 {
		t.Fatalf("%d handlers ran at once, concurrency 4", handlers)
	}
	if claimed <= 4 {
		t.Fatalf("at most %d tasks claimed at once: short tasks were not claimed ahead", claimed)
	}
	t.Logf("short tasks: at most %d handlers at once, %d claimed", handlers, claimed)
}

// Long tasks are not claimed ahead: the worker holds no more tasks than it
// runs, so that it does not sit on tasks other workers could run.
func TestLongTasksNotClaimedAhead(t *testing.T) {
	// Prefetch 12: claimed ahead, the worker would hold up to 16.
	handlers, claimed := runCounted(t, 24, 12, 60*time.Millisecond)
	if handlers > 4 {
		t.Fatalf("%d handlers ran at once, concurrency 4", handlers)
	}
	if claimed > 8 {
		t.Fatalf("the queue showed %d tasks RUNNING at once with concurrency 4 and tasks of 60 ms: claimed ahead", claimed)
	}
}
