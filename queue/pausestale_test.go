package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestPauseStaleShortPolls: a Client that learned of a pause from a
// refused claim, and whose queue another Client resumed, claims again on
// its next claim without a wait (Wait 0), however long after: its shared
// watch closed meanwhile, so no wait saw the resume for it.
func TestPauseStaleShortPolls(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	srvC, cliA := newClient(t, ns)
	queue.SetWatchLinger(srvC, 50*time.Millisecond)
	admin, _ := newClient(t, ns)
	ctx := context.Background()
	submitN(t, admin, "sp", 5, nil)
	if _, err := admin.Pause(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cliA, 60*time.Second)
	req := queue.ClaimRequest{Lease: l, Worker: "poller", Max: 1}
	if ts, err := srvC.Claim(ctx, "sp", req); err != nil || len(ts) != 0 {
		t.Fatalf("claim while paused: %v %v", ts, err)
	}
	if _, err := admin.Resume(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		// Each poll once the Client's watch of the queue has closed.
		waitFor(t, "the shared watch closes", func() bool { return queue.LiveWatches(srvC) == 0 })
		ts, err := srvC.Claim(ctx, "sp", req)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 1 {
			st, _ := admin.Stats(ctx, "sp")
			t.Fatalf("poll %d of a resumed queue claimed %d tasks: %+v", i, len(ts), st)
		}
	}
	// Still paused: a claim without a wait answers nothing, at once.
	if _, err := admin.Pause(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	if ts, err := srvC.Claim(ctx, "sp", req); err != nil || len(ts) != 0 {
		t.Fatalf("claim while paused again: %v %v", ts, err)
	}
}

// TestPauseDrainEmpty: WorkerConfig.Drain returns once nothing is
// pending, running or retrying, paused or not: on an empty paused queue
// at once.
func TestPauseDrainEmpty(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "dr", 2, nil)
	w0 := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "dr", Concurrency: 2, Drain: true})
	w0.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) { return nil, nil })
	if err := w0.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(context.Background(), "dr"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "dr", Concurrency: 2, Drain: true})
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) { return nil, nil })
	err := w.Run(ctx)
	if err != nil || ctx.Err() != nil {
		st, _ := c.Stats(context.Background(), "dr")
		t.Fatalf("drain on an empty paused queue ran until ctx ended (%v): %+v", err, st)
	}
}

// TestPauseDrainWaitsForResume: a draining worker on a paused queue with
// tasks pending waits for the resume, then drains them and returns.
func TestPauseDrainWaitsForResume(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	submitN(t, c, "dw", 3, nil)
	if _, err := c.Pause(ctx, "dw"); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "dw", Concurrency: 2, Drain: true})
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) { return nil, nil })
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	select {
	case err := <-done:
		t.Fatalf("a draining worker returned while tasks waited on the paused queue: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	if _, err := c.Resume(ctx, "dw"); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil || rctx.Err() != nil {
		t.Fatalf("drain after the resume: %v (ctx %v)", err, rctx.Err())
	}
	if st, err := c.Stats(ctx, "dw"); err != nil || st.Succeeded != 3 || st.Unfinished() != 0 {
		t.Fatalf("after the drain: %+v %v", st, err)
	}
}

// TestPauseDrainRunningTask: a draining worker whose last task runs when
// the queue is paused returns once that task ends (it wakes for it; no
// resume comes).
func TestPauseDrainRunningTask(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	submitN(t, c, "dt-run", 1, nil)
	started, release := make(chan struct{}), make(chan struct{})
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "dt-run", Concurrency: 1, Drain: true})
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		close(started)
		<-release
		return nil, nil
	})
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	<-started
	if _, err := c.Pause(ctx, "dt-run"); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	close(release)
	if err := <-done; err != nil || rctx.Err() != nil {
		t.Fatalf("drain with the last task ending while paused: %v (ctx %v)", err, rctx.Err())
	}
	// Well within the 30 s safety net of a paused wait: the task's end woke it.
	if d := time.Since(began); d > 20*time.Second {
		t.Fatalf("the draining worker returned %v after its last task ended", d)
	}
}
