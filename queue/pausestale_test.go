package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// pausedGauge is drover_queue_paused for queue q, and whether it is set.
func pausedGauge(t *testing.T, q string) (float64, bool) {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "drover_queue_paused" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "queue" && lp.GetValue() == q {
					return m.GetGauge().GetValue(), true
				}
			}
		}
	}
	return 0, false
}

// TestPauseGaugeOwner: a Client that pauses or claims does not set
// drover_queue_paused (a server's Clients serve many namespaces, and the
// gauge has no namespace label); a Worker's Client sets it for its queue.
func TestPauseGaugeOwner(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	submitN(t, c, "gauge-owner", 1, nil)
	if _, err := c.Pause(ctx, "gauge-owner"); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cli, 60*time.Second)
	if _, err := c.Claim(ctx, "gauge-owner", queue.ClaimRequest{Lease: l, Worker: "x"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Paused(ctx, "gauge-owner"); err != nil {
		t.Fatal(err)
	}
	if v, ok := pausedGauge(t, "gauge-owner"); ok {
		t.Fatalf("a Client without a Worker set drover_queue_paused to %v", v)
	}
	rctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "gauge-owner", Concurrency: 1})
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) { return nil, nil })
	done := make(chan error, 1)
	go func() { done <- w.Run(rctx) }()
	waitFor(t, "the worker sets the gauge", func() bool { v, ok := pausedGauge(t, "gauge-owner"); return ok && v == 1 })
	if _, err := c.Resume(ctx, "gauge-owner"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker clears the gauge", func() bool { v, ok := pausedGauge(t, "gauge-owner"); return ok && v == 0 })
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
}

// TestPauseDeletedQueue: a pause checks that its queue exists in its own
// transaction: a queue deleted meanwhile (here: deleted, with a key of it
// left over, as a submission racing with the deletion may leave one) is
// ErrNoQueue, and no pause key outlives it; a pause racing with the
// deletion either lands first, and goes with the queue, or finds none.
func TestPauseDeletedQueue(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	submitN(t, c, "gone", 2, nil)
	if _, err := c.DeleteQueue(ctx, "gone", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, "/"+ns+"/queues/gone/levels/5", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Pause(ctx, "gone"); !errors.Is(err, queue.ErrNoQueue) {
		t.Fatalf("pause of a deleted queue: %v, want ErrNoQueue", err)
	}
	if g, err := cli.Get(ctx, "/"+ns+"/queues/gone/paused"); err != nil || len(g.Kvs) != 0 {
		t.Fatalf("pause key of a deleted queue: %v %v", g, err)
	}
	for i := 0; i < 10; i++ {
		submitN(t, c, "race", 1, nil)
		pe := make(chan error, 1)
		go func() { _, err := c.Pause(ctx, "race"); pe <- err }()
		if _, err := c.DeleteQueue(ctx, "race", nil); err != nil && !errors.Is(err, queue.ErrNoQueue) {
			t.Fatal(err)
		}
		if err := <-pe; err != nil && !errors.Is(err, queue.ErrNoQueue) {
			t.Fatal(err)
		}
		name, _ := cli.Get(ctx, "/"+ns+"/queue-names/race", clientv3.WithCountOnly())
		key, _ := cli.Get(ctx, "/"+ns+"/queues/race/paused", clientv3.WithCountOnly())
		if name.Count == 0 && key.Count > 0 {
			t.Fatalf("round %d: a pause key outlived its queue", i)
		}
	}
}
