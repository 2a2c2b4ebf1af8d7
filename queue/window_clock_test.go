package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestSegmentNamedBeforeTheWindowIsClaimed: a worker that found its queue
// empty reads it from about then on; a task submitted just after, by a
// submitter whose clock is 5 s behind (its segment named before that), is
// claimed when its watch event comes, not at the worker's 30 s safety net.
func TestSegmentNamedBeforeTheWindowIsClaimed(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	late, _ := newClient(t, ns)
	queue.SetClock(late, func() time.Time { return time.Now().Add(-5 * time.Second) })
	got := make(chan string, 4)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	w.HandleAll(func(_ context.Context, tk *queue.Task) ([]byte, error) {
		got <- tk.ID
		return nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = w.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	ctx2, cancel2 := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel2()
	submitAndWait := func(sub *queue.Client, id string, within time.Duration) {
		t.Helper()
		start := time.Now()
		if _, err := sub.Submit(ctx2, "q", []queue.Task{{ID: id, Type: "noop"}}, nil); err != nil {
			t.Fatal(err)
		}
		select {
		case g := <-got:
			if g != id {
				t.Fatalf("got %s, want %s", g, id)
			}
			t.Logf("%s claimed %s after its submission", id, time.Since(start).Round(time.Millisecond))
		case <-time.After(within):
			t.Fatalf("%s not claimed within %s of its submission", id, within)
		}
	}
	submitAndWait(c, "first", 10*time.Second)
	// Over a second later, so that the worker's next empty read of the
	// queue is one without a bound, which starts the window at about now.
	time.Sleep(1200 * time.Millisecond)
	submitAndWait(c, "second", 10*time.Second)
	time.Sleep(200 * time.Millisecond) // the worker found the queue empty again
	submitAndWait(late, "behind", 5*time.Second)
}
