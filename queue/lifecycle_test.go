package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestWorkerStop: Stop before Run makes Run return at once; Stop waits for
// a running task to finish; StopAndCancel cancels it and hands it back, its
// attempt not counted; both are safe to call again, and Close twice too.
func TestWorkerStop(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()

	unstarted := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "life"})
	for range 2 { // closing a worker that never ran, twice
		if err := unstarted.Close(ctx); err != nil {
			t.Fatalf("Close before Run: %v", err)
		}
	}
	if err := unstarted.StopAndCancel(ctx); err != nil {
		t.Fatalf("StopAndCancel before Run: %v", err)
	}

	early := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "life"})
	if err := early.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if err := early.Run(ctx); err != nil || time.Since(began) > 5*time.Second {
		t.Fatalf("Run after Stop: %v after %s", err, time.Since(began))
	}
	if err := early.Run(ctx); err == nil {
		t.Fatal("a second Run was accepted")
	}

	if _, err := c.Submit(ctx, "life", []queue.Task{{ID: "slow", Type: "t"}, {ID: "stuck", Type: "t"}}, nil); err != nil {
		t.Fatal(err)
	}
	run := func(w *queue.Worker) chan error {
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		return done
	}
	// Graceful: the running task finishes.
	started, finish := make(chan string, 2), make(chan struct{})
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "life", Concurrency: 1})
	w.HandleAll(func(hctx context.Context, task *queue.Task) ([]byte, error) {
		started <- task.ID
		select {
		case <-finish:
			return []byte("done"), nil
		case <-hctx.Done():
			return nil, context.Cause(hctx)
		}
	})
	done := run(w)
	first := <-started
	stopped := make(chan error, 1)
	go func() { stopped <- w.Stop(ctx) }()
	time.Sleep(200 * time.Millisecond)
	close(finish)
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, _ := c.Get(ctx, first); got.CurrentStatus != queue.Succeeded {
		t.Fatalf("after Stop, %s is %s, want SUCCEEDED", first, got.CurrentStatus)
	}
	if err := w.Stop(ctx); err != nil {
		t.Fatal(err)
	}

	// Hard: the running task is cancelled and handed back.
	w2 := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "life", Concurrency: 1, ShutdownTimeout: time.Hour})
	cause := make(chan error, 1)
	w2.HandleAll(func(hctx context.Context, task *queue.Task) ([]byte, error) {
		started <- task.ID
		<-hctx.Done()
		cause <- context.Cause(hctx)
		return nil, context.Cause(hctx)
	})
	done = run(w2)
	second := <-started
	began = time.Now()
	if err := w2.StopAndCancel(ctx); err != nil || time.Since(began) > 10*time.Second {
		t.Fatalf("StopAndCancel: %v after %s", err, time.Since(began))
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, queue.ErrShutdown) {
		t.Fatalf("handler's cause %v, want ErrShutdown", err)
	}
	if got, _ := c.Get(ctx, second); got.CurrentStatus != queue.Pending || got.RetriesAttempted != 0 {
		t.Fatalf("after StopAndCancel, %s is %s with %d retries, want PENDING, 0", second, got.CurrentStatus, got.RetriesAttempted)
	}
	if err := w2.StopAndCancel(ctx); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := w2.Close(ctx); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
}
