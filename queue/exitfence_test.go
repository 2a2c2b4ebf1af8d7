package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestNeighbourCancelledWhileRunRuns: a run's outcomes are fenced by one
// compare that no task of its segment left it since the claim. Another
// task of the same segment, cancelled while the run's tasks run, refuses
// that compare; the outcomes are then written again with a compare per
// slot, so the run's tasks still succeed, none is counted as fenced, and
// the cancelled one stays cancelled.
func TestNeighbourCancelledWhileRunRuns(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	ts := tasks(20, "noop")
	if _, err := c.Submit(ctx, "nb", ts, nil); err != nil {
		t.Fatal(err)
	}
	started := make(chan string, 20)
	release := make(chan struct{})
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "nb", Concurrency: 2, Prefetch: 2, Drain: true})
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		started <- t.ID
		<-release
		return nil, nil
	})
	done := make(chan struct{})
	go func() { defer close(done); runDrain(t, w) }()
	for range 2 {
		select {
		case <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("no task started")
		}
	}
	last := ts[len(ts)-1].ID
	if _, err := c.Cancel(ctx, last); err != nil {
		t.Fatalf("cancel %s: %v", last, err)
	}
	close(release)
	<-done
	st, err := c.Stats(ctx, "nb")
	if err != nil {
		t.Fatal(err)
	}
	if st.Succeeded != 19 || st.Cancelled != 1 {
		t.Fatalf("stats %+v; want 19 succeeded and 1 cancelled", st)
	}
	if ws := w.Stats(); ws.Fenced != 0 || ws.Succeeded != 19 {
		t.Fatalf("worker %+v; want 19 succeeded and none fenced", ws)
	}
}
