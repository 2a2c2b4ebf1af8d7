package queue_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stuckHandler is a handler whose first call ignores its context: it
// blocks until release is closed, then tries a write under its claim and
// returns "late". Later calls return "second" at once.
type stuckHandler struct {
	cli      *clientv3.Client
	key      string        // where the late write goes
	started  chan struct{} // closed when the first call started
	release  chan struct{} // closed by the test: the first call returns
	returned chan error    // the late write's error
	calls    atomic.Int32
	once     sync.Once
}

// free lets the first call return (again: no effect).
func (s *stuckHandler) free() { s.once.Do(func() { close(s.release) }) }

func newStuckHandler(cli *clientv3.Client, key string) *stuckHandler {
	return &stuckHandler{cli: cli, key: key, started: make(chan struct{}), release: make(chan struct{}), returned: make(chan error, 1)}
}

func (s *stuckHandler) handle(hctx context.Context, t *queue.Task) ([]byte, error) {
	if s.calls.Add(1) > 1 {
		return []byte("second"), nil
	}
	close(s.started)
	// The context is ignored on purpose; the task is read meanwhile, as
	// the worker writes the attempt's outcome (the race detector's part).
	for stuck := true; stuck; {
		select {
		case <-s.release:
			stuck = false
		case <-time.After(time.Millisecond):
			_, _ = json.Marshal(t)
		}
	}
	_, err := queue.ClaimFence(hctx).Txn(context.Background()).Then(clientv3.OpPut(s.key, "late")).Commit()
	s.returned <- err
	return []byte("late"), nil
}

// lateResultFenced releases the stuck handler and checks that its write
// under the claim and its result were refused: the task keeps the result
// of the attempt that replaced it.
func (s *stuckHandler) lateResultFenced(t *testing.T, c *queue.Client, q, id string) {
	t.Helper()
	ctx := context.Background()
	if n := testutil.ToFloat64(metrics.HandlersStuck.WithLabelValues(q)); n != 1 {
		t.Errorf("drover_handlers_stuck is %v while the abandoned handler runs, want 1", n)
	}
	s.free()
	if err := <-s.returned; err == nil {
		t.Error("the abandoned handler's write under its claim was accepted")
	}
	if resp, err := s.cli.Get(ctx, s.key); err != nil || len(resp.Kvs) != 0 {
		t.Errorf("the abandoned handler's write is stored (%v, err %v)", resp.Kvs, err)
	}
	got, err := c.Get(ctx, id)
	if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != "second" {
		t.Fatalf("after the late return the task is %+v (err %v), want SUCCEEDED with the second attempt's result", got, err)
	}
	// The stuck count comes back down once the handler returned.
	for i := 0; testutil.ToFloat64(metrics.HandlersStuck.WithLabelValues(got.Queue)) != 0; i++ {
		if i == 500 {
			t.Fatal("drover_handlers_stuck stayed above 0 after the abandoned handler returned")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestAbandonStuckHandlerOnStop: a handler that ignores its context does
// not hold Stop for ever. Once the shutdown timeout passed and the handler
// was cancelled, the worker waits the timeout once more, then gives up on
// it: Run returns, the task is handed back (PENDING, attempt not charged),
// another worker runs it, and the stuck handler's late result and write
// are fenced out.
func TestAbandonStuckHandlerOnStop(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "abandon-stop"
	if _, err := c.Submit(ctx, q, []queue.Task{{ID: "stuck", Type: "ignores-ctx"}}, nil); err != nil {
		t.Fatal(err)
	}
	abandoned := metrics.HandlersAbandoned.WithLabelValues(q, "ignores-ctx")
	before := testutil.ToFloat64(abandoned)
	h := newStuckHandler(cli, "/"+ns+"/late-write")
	t.Cleanup(h.free) // a test that failed does not leave the handler behind
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, ShutdownTimeout: 20 * time.Millisecond})
	w.HandleAll(h.handle)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(ctx) }()
	<-h.started

	stopCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	if err := w.Stop(stopCtx); err != nil {
		t.Fatalf("Stop with a handler that ignores its context: %v", err)
	}
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if got := testutil.ToFloat64(abandoned) - before; got != 1 {
		t.Fatalf("drover_handlers_abandoned_total grew by %v, want 1", got)
	}
	got, err := c.Get(ctx, "stuck")
	if err != nil || got.CurrentStatus != queue.Pending || got.RetriesAttempted != 0 {
		t.Fatalf("after Stop gave up on the handler the task is %+v (err %v), want PENDING, no retry charged", got, err)
	}

	w2 := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, Drain: true})
	w2.HandleAll(h.handle)
	if err := w2.Run(ctx); err != nil {
		t.Fatal(err)
	}
	h.lateResultFenced(t, c, q, "stuck")
}

// TestAbandonStuckHandlerOnLostClaim: when a running task's claim is lost
// (its run deleted, as a lease's expiry does) and its handler ignores the
// context, the worker gives up on the handler after the shutdown timeout:
// its only slot is free again, so it claims the task again and runs it to
// the end; the stuck handler's late result and write are fenced out.
func TestAbandonStuckHandlerOnLostClaim(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "abandon-lost"
	if _, err := c.Submit(ctx, q, []queue.Task{{ID: "stuck", Type: "ignores-ctx"}}, nil); err != nil {
		t.Fatal(err)
	}
	abandoned := metrics.HandlersAbandoned.WithLabelValues(q, "ignores-ctx")
	before := testutil.ToFloat64(abandoned)
	h := newStuckHandler(cli, "/"+ns+"/late-write")
	t.Cleanup(h.free) // a test that failed does not leave the handler behind
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, ShutdownTimeout: 20 * time.Millisecond})
	w.HandleAll(h.handle)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	defer func() {
		stop()
		h.free()
		<-ran
	}()
	<-h.started

	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Delete(ctx, keys.Runs(q, ""), clientv3.WithPrefix()); err != nil || resp.Deleted == 0 {
		t.Fatalf("delete the task's claim: %v (%d keys)", err, resp.Deleted)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	got, err := c.Wait(waitCtx, "stuck")
	if err != nil || got.CurrentStatus != queue.Succeeded {
		t.Fatalf("the task after its claim was lost under a stuck handler: %+v, %v; want it run again to SUCCEEDED", got, err)
	}
	if got := testutil.ToFloat64(abandoned) - before; got != 1 {
		t.Fatalf("drover_handlers_abandoned_total grew by %v, want 1", got)
	}
	h.lateResultFenced(t, c, q, "stuck")
}

// TestAbandonStuckHandlerOnTimeout: a handler that outlives its attempt's
// timeout and ignores its context is given up after the shutdown timeout:
// the attempt fails with ErrAbandoned and ErrTimeout and is retried, the
// retry runs on the slot it freed, and the late result is fenced out.
func TestAbandonStuckHandlerOnTimeout(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "abandon-timeout"
	retries := 3
	task := queue.Task{ID: "stuck", Type: "ignores-ctx", MaxRetries: &retries,
		Timeout: queue.Duration(50 * time.Millisecond), BackoffBase: queue.Duration(time.Millisecond), BackoffMax: queue.Duration(time.Millisecond)}
	if _, err := c.Submit(ctx, q, []queue.Task{task}, nil); err != nil {
		t.Fatal(err)
	}
	h := newStuckHandler(cli, "/"+ns+"/late-write")
	t.Cleanup(h.free)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, ShutdownTimeout: 20 * time.Millisecond})
	w.HandleAll(h.handle)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	defer func() {
		stop()
		h.free()
		<-ran
	}()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	got, err := c.Wait(waitCtx, "stuck")
	if err != nil || got.CurrentStatus != queue.Succeeded || got.RetriesAttempted < 1 || string(got.Result) != "second" {
		t.Fatalf("the task after its first attempt timed out under a stuck handler: %+v, %v; want SUCCEEDED by a retry", got, err)
	}
	abandonedErr := false
	for _, tr := range got.Transitions {
		abandonedErr = abandonedErr || strings.Contains(tr.Error, "abandoned") && strings.Contains(tr.Error, "timed out")
	}
	if !abandonedErr {
		t.Errorf("no transition says the attempt timed out and its handler was abandoned: %+v", got.Transitions)
	}
	h.lateResultFenced(t, c, q, "stuck")
}

// heldHandlers is a handler whose every call ignores its context and
// blocks until the test releases its task's id; then it returns its id.
type heldHandlers struct {
	started chan string // the ids of the calls, as they start
	mu      sync.Mutex
	release map[string]chan struct{}
}

func newHeldHandlers(ids ...string) *heldHandlers {
	h := &heldHandlers{started: make(chan string, len(ids)), release: map[string]chan struct{}{}}
	for _, id := range ids {
		h.release[id] = make(chan struct{})
	}
	return h
}

// free lets the call of task id return (again: no effect).
func (h *heldHandlers) free(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if ch := h.release[id]; ch != nil {
		close(ch)
		h.release[id] = nil
	}
}

func (h *heldHandlers) freeAll() {
	for _, id := range []string{"a", "b", "stuck", "holder"} {
		h.free(id)
	}
}

func (h *heldHandlers) handle(_ context.Context, t *queue.Task) ([]byte, error) {
	h.mu.Lock()
	ch := h.release[t.ID]
	h.mu.Unlock()
	h.started <- t.ID
	if ch != nil {
		<-ch
	}
	return []byte(t.ID), nil
}

// TestAbandonCappedAtConcurrency: a worker gives up on at most as many
// handlers as its concurrency. With one slot and one handler already
// given up on and still running, a second handler that outlives its
// context is waited for (its slot stays taken, the task stays RUNNING,
// the worker logs it) until the first returns; then it is given up on
// too.
func TestAbandonCappedAtConcurrency(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "abandon-cap"
	none := 0
	var ts []queue.Task
	for _, id := range []string{"a", "b"} {
		ts = append(ts, queue.Task{ID: id, Type: "ignores-ctx", MaxRetries: &none, Timeout: queue.Duration(50 * time.Millisecond)})
	}
	if _, err := c.Submit(ctx, q, ts, nil); err != nil {
		t.Fatal(err)
	}
	abandoned := metrics.HandlersAbandoned.WithLabelValues(q, "ignores-ctx")
	before := testutil.ToFloat64(abandoned)
	h := newHeldHandlers("a", "b")
	t.Cleanup(h.freeAll)
	logs := &etcdtest.LogBuffer{}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, ShutdownTimeout: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	w.HandleAll(h.handle)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	defer func() {
		stop()
		h.freeAll()
		<-ran
	}()
	first, second := <-h.started, <-h.started // the second starts on the slot the first's abandonment freed
	for i := 0; !strings.Contains(logs.String(), "as many handlers as the worker's concurrency were given up on"); i++ {
		if i == 3000 {
			t.Fatalf("the worker never said it waits for the second stuck handler; logs:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := testutil.ToFloat64(abandoned) - before; n != 1 {
		t.Fatalf("drover_handlers_abandoned_total grew by %v with one slot, want 1 (the cap)", n)
	}
	if got, err := c.Get(ctx, second); err != nil || got.CurrentStatus != queue.Running {
		t.Fatalf("task %s while the worker waits for its handler: %+v (err %v), want RUNNING", second, got, err)
	}
	if got, err := c.Get(ctx, first); err != nil || got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "abandoned") {
		t.Fatalf("task %s whose handler was given up on: %+v (err %v), want DEAD, abandoned", first, got, err)
	}

	h.free(first)                                               // one stuck handler returns: the second may be given up on
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	got, err := c.Wait(waitCtx, second)
	if err != nil || got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "abandoned") {
		t.Fatalf("task %s once the first stuck handler returned: %+v (err %v), want DEAD, abandoned", second, got, err)
	}
	if n := testutil.ToFloat64(abandoned) - before; n != 2 {
		t.Fatalf("drover_handlers_abandoned_total grew by %v, want 2", n)
	}
}

// TestAbandonedHandlerFencedInRun: a task claimed in one run with
// another shares the run's key, which stays while the other runs; the
// handler of the first, given up on after its timeout and its task's
// outcome written, still may not write under its claim (a checkpoint, a
// child, a stream event: all go through the claim's fence).
func TestAbandonedHandlerFencedInRun(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "abandon-run"
	none := 0
	ts := []queue.Task{ // one submission: one segment, claimed in one run
		{ID: "stuck", Type: "t", MaxRetries: &none, Timeout: queue.Duration(50 * time.Millisecond)},
		{ID: "holder", Type: "t"},
	}
	if _, err := c.Submit(ctx, q, ts, nil); err != nil {
		t.Fatal(err)
	}
	late := "/" + ns + "/late-write"
	h := newHeldHandlers("stuck", "holder")
	t.Cleanup(h.freeAll)
	wrote := make(chan error, 1)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 2, ShutdownTimeout: 20 * time.Millisecond})
	w.HandleAll(func(hctx context.Context, task *queue.Task) ([]byte, error) {
		r, err := h.handle(hctx, task)
		if task.ID == "stuck" {
			_, werr := queue.ClaimFence(hctx).Txn(context.Background()).Then(clientv3.OpPut(late, "late")).Commit()
			wrote <- werr
		}
		return r, err
	})
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	defer func() {
		stop()
		h.freeAll()
		<-ran
	}()
	waitCtx, cancel := context.WithTimeout(ctx, 30*time.Second) // a bound for the test, not a figure it measures
	defer cancel()
	got, err := c.Wait(waitCtx, "stuck")
	if err != nil || got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "abandoned") {
		t.Fatalf("the stuck task: %+v (err %v), want DEAD, abandoned", got, err)
	}
	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := cli.Get(ctx, keys.Runs(q, ""), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || r.Count != 1 {
		t.Fatalf("the run of both tasks is gone (%v, err %v): the test needs it held by holder", r, err)
	}
	h.free("stuck")
	if err := <-wrote; err == nil {
		t.Error("the abandoned handler's write under its run's key was accepted after its outcome was written")
	}
	if r, err := cli.Get(ctx, late, clientv3.WithCountOnly()); err != nil || r.Count != 0 {
		t.Errorf("the abandoned handler's write is stored (%v, err %v)", r, err)
	}
	h.free("holder")
	if got, err := c.Wait(waitCtx, "holder"); err != nil || got.CurrentStatus != queue.Succeeded {
		t.Fatalf("holder: %+v (err %v), want SUCCEEDED", got, err)
	}
}

// TestAbandonOverCapWhenStopping: with one slot, one handler given up on
// and a second stuck past its context, the worker waits for the second
// (the cap) until its Run's ctx ends: then it gives up on it too, over the
// cap, and Run returns while both handlers still run.
func TestAbandonOverCapWhenStopping(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q = "abandon-stop"
	none := 0
	var ts []queue.Task
	for _, id := range []string{"a", "b"} {
		ts = append(ts, queue.Task{ID: id, Type: "ignores-ctx", MaxRetries: &none, Timeout: queue.Duration(50 * time.Millisecond)})
	}
	if _, err := c.Submit(ctx, q, ts, nil); err != nil {
		t.Fatal(err)
	}
	abandoned := metrics.HandlersAbandoned.WithLabelValues(q, "ignores-ctx")
	before := testutil.ToFloat64(abandoned)
	h := newHeldHandlers("a", "b")
	t.Cleanup(h.freeAll)
	logs := &etcdtest.LogBuffer{}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, ShutdownTimeout: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	w.HandleAll(h.handle)
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(runCtx) }()
	<-h.started
	<-h.started
	for i := 0; !strings.Contains(logs.String(), "as many handlers as the worker's concurrency were given up on"); i++ {
		if i == 3000 {
			t.Fatalf("the worker never said it waits for the second stuck handler; logs:\n%s", logs)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stop()
	select {
	case <-ran:
	case <-time.After(30 * time.Second): // a bound for the test, not a figure it measures
		t.Fatal("Run did not return after its ctx ended while a handler over the cap was stuck")
	}
	if n := testutil.ToFloat64(abandoned) - before; n != 2 {
		t.Fatalf("drover_handlers_abandoned_total grew by %v, want 2 (over the cap of 1 once stopping)", n)
	}
}
