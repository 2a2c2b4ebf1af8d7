package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newClient(t *testing.T, ns string) (*queue.Client, *clientv3.Client) {
	t.Helper()
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	return c, cli
}

func newWorker(t *testing.T, cli *clientv3.Client, cfg queue.WorkerConfig) *queue.Worker {
	t.Helper()
	w, err := queue.NewWorker(context.Background(), cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

func tasks(n int, typ string) []queue.Task {
	out := make([]queue.Task, n)
	for i := range out {
		out[i] = queue.Task{ID: fmt.Sprintf("t-%05d", i), Type: typ, Parameters: json.RawMessage(fmt.Sprintf(`{"n":%d}`, i))}
	}
	return out
}

func runDrain(t *testing.T, w *queue.Worker) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatalf("worker: %v", err)
	}
	if ctx.Err() != nil {
		t.Fatal("worker did not drain within 60s")
	}
}

func TestSubmitRunDrain(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	res, err := c.Submit(context.Background(), "jobs", tasks(500, "echo"), nil)
	if err != nil || res.Submitted != 500 || res.Duplicates != 0 || len(res.Rejected) != 0 {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	again, err := c.Submit(context.Background(), "jobs", tasks(500, "echo"), nil)
	if err != nil || again.Submitted != 0 || again.Duplicates != 500 {
		t.Fatalf("resubmit: %+v, %v", again, err)
	}
	var runs sync.Map
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 16, Drain: true})
	w.Handle("echo", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		n, _ := runs.LoadOrStore(task.ID, new(atomic.Int32))
		n.(*atomic.Int32).Add(1)
		return task.Parameters, nil
	})
	runDrain(t, w)
	st, err := c.Stats(context.Background(), "jobs")
	if err != nil || st.Succeeded != 500 || st.Total() != 500 {
		t.Fatalf("stats %+v, %v", st, err)
	}
	count := 0
	runs.Range(func(k, v any) bool {
		count++
		if v.(*atomic.Int32).Load() != 1 {
			t.Errorf("%s ran %d times", k, v.(*atomic.Int32).Load())
		}
		return true
	})
	if count != 500 {
		t.Fatalf("%d tasks ran", count)
	}
	got, err := c.Get(context.Background(), "t-00042")
	if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != `{"n":42}` || got.Attempt != 1 || got.Token == 0 {
		t.Fatalf("get: %+v, %v", got, err)
	}
	var statuses []queue.Status
	for _, tr := range got.Transitions {
		statuses = append(statuses, tr.Status)
	}
	if fmt.Sprint(statuses) != "[PENDING RUNNING SUCCEEDED]" {
		t.Fatalf("transitions %v", statuses)
	}
}

func TestRetriesBackoffAndDLQ(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	two := 2
	in := []queue.Task{
		{ID: "flaky", Type: "flaky", MaxRetries: &two},
		{ID: "broken", Type: "permanent"},
		{ID: "hopeless", Type: "always", MaxRetries: &two},
		{ID: "panics", Type: "panic"},
	}
	if _, err := c.Submit(context.Background(), "jobs", in, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	attempts := map[string][]time.Time{}
	note := func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		attempts[id] = append(attempts[id], time.Now())
		return len(attempts[id])
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 4, Drain: true, BackoffBase: 200 * time.Millisecond, BackoffMax: 2 * time.Second})
	w.Handle("flaky", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		if note(task.ID) < 3 {
			return nil, errors.New("model overloaded")
		}
		return []byte("ok"), nil
	})
	w.Handle("permanent", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		note(task.ID)
		return nil, queue.Permanent(errors.New("input is not a PDF"))
	})
	w.Handle("always", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		note(task.ID)
		return nil, errors.New("still down")
	})
	w.Handle("panic", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		note(task.ID)
		panic("cannot parse " + task.ID)
	})
	runDrain(t, w)
	get := func(id string) *queue.Task {
		got, err := c.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if f := get("flaky"); f.CurrentStatus != queue.Succeeded || len(attempts["flaky"]) != 3 || f.RetriesAttempted != 2 {
		t.Fatalf("flaky: %s after %d attempts (retries %d)", f.CurrentStatus, len(attempts["flaky"]), f.RetriesAttempted)
	}
	if b := get("broken"); b.CurrentStatus != queue.Dead || len(attempts["broken"]) != 1 || !strings.Contains(b.LastError, "not a PDF") {
		t.Fatalf("permanent failure: %+v after %d attempts", b, len(attempts["broken"]))
	}
	if h := get("hopeless"); h.CurrentStatus != queue.Dead || len(attempts["hopeless"]) != 3 {
		t.Fatalf("exhausted: %s after %d attempts", h.CurrentStatus, len(attempts["hopeless"]))
	}
	if p := get("panics"); p.CurrentStatus != queue.Dead || !strings.Contains(p.LastError, "panicked") || !strings.Contains(p.LastError, "goroutine") {
		t.Fatalf("panic: %+v", p)
	}
	dead, err := c.List(context.Background(), "jobs", queue.Dead, queue.ListOptions{Limit: 10})
	if err != nil || len(dead.Tasks) != 3 || dead.Next != "" {
		t.Fatalf("dead list: %d, %q, %v", len(dead.Tasks), dead.Next, err)
	}
	// Requeue gives a fresh budget; now it succeeds.
	n, err := c.Requeue(context.Background(), "jobs", []string{"hopeless"}, nil)
	if err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	w2 := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true})
	w2.Handle("always", func(ctx context.Context, task *queue.Task) ([]byte, error) { return []byte("finally"), nil })
	runDrain(t, w2)
	if h := get("hopeless"); h.CurrentStatus != queue.Succeeded || h.Attempt != 1 {
		t.Fatalf("requeued task: %+v", h)
	}
	st, _ := c.Stats(context.Background(), "jobs")
	if st.Dead != 2 || st.Succeeded != 2 || st.Total() != 4 {
		t.Fatalf("stats %+v", st)
	}
	if n, err := c.Purge(context.Background(), "jobs", queue.Dead, nil, nil); err != nil || n != 2 {
		t.Fatalf("purge: %d, %v", n, err)
	}
}

func TestSubmitRejectsBadTasks(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	neg := -1
	in := []queue.Task{
		{ID: "ok-1", Type: "t"},
		{ID: "a/b", Type: "t"},
		{ID: "ok-2", Type: ""},
		{ID: "ok-3", Type: "t", MaxRetries: &neg},
		{ID: "ok-4", Type: "t", Parameters: json.RawMessage(`{"big":"` + strings.Repeat("x", queue.MaxPayload) + `"}`)},
		{ID: "ok-5", Type: "t", Metadata: queue.Metadata{Priority: 5000}},
		{ID: "ok-6", Type: "t"},
	}
	res, err := c.Submit(context.Background(), "jobs", in, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Submitted != 2 || len(res.Rejected) != 5 {
		t.Fatalf("result %+v", res)
	}
	for i, want := range []struct {
		line  int
		field string
	}{{2, "task_id"}, {3, "task_type"}, {4, "max_retries"}, {5, "parameters"}, {6, "metadata.priority"}} {
		if r := res.Rejected[i]; r.Line != want.line || !strings.Contains(r.Error, want.field) {
			t.Fatalf("rejection %d = %+v, want line %d naming %s", i, r, want.line, want.field)
		}
	}
	if _, err := c.Submit(context.Background(), "bad/queue", in[:1], nil); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("bad queue name: %v", err)
	}
}

func TestCancelRunningTask(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: "long", Type: "slow"}}, nil); err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	cause := make(chan error, 1)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true})
	w.Handle("slow", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		close(started)
		<-ctx.Done()
		cause <- context.Cause(ctx)
		return nil, ctx.Err()
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	<-started
	if _, err := c.Cancel(context.Background(), "long"); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-cause:
		if !errors.Is(err, queue.ErrCancelled) {
			t.Fatalf("handler context cause %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("handler context not cancelled")
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	got, _ := c.Get(context.Background(), "long")
	if got.CurrentStatus != queue.Cancelled {
		t.Fatalf("status %s", got.CurrentStatus)
	}
	if _, err := c.Cancel(context.Background(), "long"); !errors.Is(err, queue.ErrFinished) {
		t.Fatalf("second cancel: %v", err)
	}
}

func TestRetentionKeepsCounts(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", tasks(300, "echo"), nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 16, Drain: true, Retention: -1})
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) { return nil, nil })
	runDrain(t, w)
	if _, err := c.Cancel(context.Background(), "t-00000"); !errors.Is(err, queue.ErrFinished) {
		t.Fatalf("cancel of a finished task: %v", err)
	}
	// Two sweepers at once: every task is removed and counted exactly once.
	var wg sync.WaitGroup
	var removed atomic.Int64
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n, err := c.RemoveExpired(context.Background(), "jobs", 0)
			if err != nil {
				t.Error(err)
			}
			removed.Add(int64(n))
		}()
	}
	wg.Wait()
	if removed.Load() != 300 {
		t.Fatalf("removed %d, want 300", removed.Load())
	}
	st, err := c.Stats(context.Background(), "jobs")
	if err != nil || st.Succeeded != 300 || st.Total() != 300 {
		t.Fatalf("stats after removal %+v (%v), want the 300 still counted", st, err)
	}
	if _, err := c.Get(context.Background(), "t-00007"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("a removed task is still readable: %v", err)
	}
	g, _ := cli.Get(context.Background(), "/"+ns+"/tasks/", clientv3.WithPrefix(), clientv3.WithCountOnly())
	if g.Count != 0 {
		t.Fatalf("%d task records left", g.Count)
	}
}

// Claim loops run side by side and share the worker's slots: however they
// interleave, no more handlers run at once than Concurrency, every slot is
// used, and every task runs exactly once.
func TestConcurrencyBoundAcrossClaimers(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", tasks(600, "work"), nil); err != nil {
		t.Fatal(err)
	}
	const conc = 6
	var running, peak atomic.Int32
	var runs sync.Map
	full := make(chan struct{}) // closed once conc handlers ran at once
	var fullOnce sync.Once
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: conc, Prefetch: 4, Drain: true})
	w.Handle("work", func(ctx context.Context, task *queue.Task) ([]byte, error) {
		n := running.Add(1)
		defer running.Add(-1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		if n >= conc {
			fullOnce.Do(func() { close(full) })
		}
		if _, dup := runs.LoadOrStore(task.ID, true); dup {
			t.Errorf("%s ran twice", task.ID)
		}
		// The first handlers wait for the slots to fill (bounded), so the
		// peak does not depend on how claims happen to overlap; every
		// handler then holds its slot a while, long enough for a claim
		// beyond the slots to start a handler beside it.
		select {
		case <-full:
		case <-time.After(5 * time.Second):
		}
		time.Sleep(20 * time.Millisecond)
		return nil, nil
	})
	runDrain(t, w)
	if p := peak.Load(); p != conc {
		t.Fatalf("peak handlers at once %d, want %d (the concurrency)", p, conc)
	}
	st, err := c.Stats(context.Background(), "jobs")
	if err != nil || st.Succeeded != 600 || st.Total() != 600 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

// Submission keeps several requests in flight: the counts stay exact, the
// progress only grows, and a submission cut short counts no more than went
// in, and submitting again completes it with duplicates for the rest.
func TestPipelinedSubmitCounts(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	all := tasks(3000, "work")
	if res, err := c.Submit(context.Background(), "jobs", all[:500], nil); err != nil || res.Submitted != 500 {
		t.Fatalf("first 500: %+v, %v", res, err)
	}
	var last atomic.Int64
	res, err := c.Submit(context.Background(), "jobs", all, func(done int) {
		if prev := last.Swap(int64(done)); int64(done) < prev {
			t.Errorf("progress went back from %d to %d", prev, done)
		}
	})
	if err != nil || res.Submitted != 2500 || res.Duplicates != 500 || last.Load() != 3000 {
		t.Fatalf("pipelined: %+v, progress %d, %v", res, last.Load(), err)
	}
	records := func() int64 {
		g, err := cli.Get(context.Background(), keyspace.MustNew(ns).TaskIndex(""), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return g.Count
	}
	if n := records(); n != 3000 {
		t.Fatalf("%d records, want 3000", n)
	}

	// Cut short: cancelled after the first request came back.
	more := make([]queue.Task, 3000)
	for i := range more {
		more[i] = queue.Task{ID: fmt.Sprintf("m-%05d", i), Type: "work"}
	}
	ctx, cancel := context.WithCancel(context.Background())
	first, err := c.Submit(ctx, "jobs", more, func(int) { cancel() })
	cancel()
	if err == nil || !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "submitting again is safe") {
		t.Fatalf("cut short: %+v, %v", first, err)
	}
	// A request cut short on this side may still be applied by etcd, so
	// what went in is known only from the resubmission's duplicates.
	again, err := c.Submit(context.Background(), "jobs", more, nil)
	if err != nil || again.Submitted+again.Duplicates != 3000 || records() != 6000 {
		t.Fatalf("again: %+v, %d records, %v", again, records(), err)
	}
	if first.Submitted == 0 || first.Submitted > again.Duplicates || again.Duplicates == 3000 {
		t.Fatalf("cut short: counted %d submitted, %d had gone in", first.Submitted, again.Duplicates)
	}

	// Tasks given their ids by Submit would go in twice: the error says so
	// instead of calling a resubmission safe.
	anon := make([]queue.Task, 3000)
	for i := range anon {
		anon[i] = queue.Task{Type: "work"}
	}
	ctx, cancel = context.WithCancel(context.Background())
	_, err = c.Submit(ctx, "jobs", anon, func(int) { cancel() })
	cancel()
	if err == nil || strings.Contains(err.Error(), "submitting again is safe") || !strings.Contains(err.Error(), "would add them twice") {
		t.Fatalf("cut short without ids: %v", err)
	}
}
