package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// TestRunnerAndQueueNeverHoldOneTaskAtOnce: 24 agent tasks are each both
// queued (and run by a queue worker's Steps handler) and run by a task
// runner, at the same time, each side with its own etcd client and lease.
// No task's steps ever run on both sides at once, and each step of each
// task runs exactly once: the side that comes second finds it done. Before
// a queue claim checked the runner's lock (and the runner waited for a queue
// claim), both sides ran the same task at once.
func TestRunnerAndQueueNeverHoldOneTaskAtOnce(t *testing.T) {
	const n = 24
	ns := etcdtest.Namespace(t)
	c, qcli := newClient(t, ns)
	var mu sync.Mutex
	active, peak, runs := map[string]int{}, map[string]int{}, map[string]int{}
	stepsFor := func(id string) []task.Step {
		step := func(name string) task.Step {
			return task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
				mu.Lock()
				active[id]++
				peak[id] = max(peak[id], active[id])
				runs[id+"/"+name]++
				mu.Unlock()
				time.Sleep(30 * time.Millisecond)
				mu.Lock()
				active[id]--
				mu.Unlock()
				return state, nil
			}}
		}
		return []task.Step{step("a"), step("b"), step("c")}
	}
	ts := make([]queue.Task, n)
	for i := range ts {
		ts[i] = queue.Task{ID: fmt.Sprintf("race-%02d", i), Type: "steps"}
	}
	// A FIFO queue, claimed in the order the runner goes: both sides
	// reach for the same tasks at the same moment.
	if err := c.SetConfig(context.Background(), "jobs", queue.Config{FIFO: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), "jobs", ts, nil); err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(qcli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, qcli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 4, Prefetch: 1, Drain: true})
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		return queue.Steps(store, stepsFor(t.ID)...)(ctx, t)
	})
	rcli := srv.Client(t)
	r, err := task.NewRunner(context.Background(), rcli, task.RunnerConfig{Namespace: ns, WorkerID: "runner", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())

	var wg sync.WaitGroup
	wg.Go(func() { runDrain(t, w) })
	sem := make(chan struct{}, 4)
	for i := range ts {
		id := ts[i].ID
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			if _, err := r.Run(ctx, id, stepsFor(id)); err != nil {
				t.Errorf("runner %s: %v", id, err)
			}
		})
	}
	wg.Wait()
	for _, task := range ts {
		if peak[task.ID] != 1 {
			t.Errorf("task %s ran on both sides at once (peak %d)", task.ID, peak[task.ID])
		}
		for _, s := range []string{"a", "b", "c"} {
			if k := task.ID + "/" + s; runs[k] != 1 {
				t.Errorf("step %s ran %d times", k, runs[k])
			}
		}
	}
	if st, err := c.Stats(context.Background(), "jobs"); err != nil || st.Succeeded != n {
		t.Fatalf("stats %+v, %v", st, err)
	}
}

// TestRunnerHeldTaskLeftOutOfClaims: a task runner holds one task of a
// segment. A worker's claim that picks it is refused; the worker then finds
// which task the runner holds and claims the others, which all succeed
// while the held one waits. Once the runner lets it go, the worker runs it
// too. Without that finding, every claim of the segment would be refused
// again and nothing would run.
func TestRunnerHeldTaskLeftOutOfClaims(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, qcli := newClient(t, ns)
	ctx := context.Background()
	ts := tasks(10, "noop")
	if _, err := c.Submit(ctx, "held", ts, nil); err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(qcli, ns)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.NewEtcd(ctx, srv.Client(t), lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	held := ts[3].ID
	l, err := store.Claim(ctx, locker, held, task.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	ran := map[string]int{}
	w := newWorker(t, qcli, queue.WorkerConfig{Namespace: ns, Queue: "held", Concurrency: 10, Prefetch: 10})
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		mu.Lock()
		ran[t.ID]++
		mu.Unlock()
		return nil, nil
	})
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	defer func() { stop(); <-done }()
	succeeded := func() int64 {
		st, err := c.Stats(ctx, "held")
		if err != nil {
			t.Fatal(err)
		}
		return st.Succeeded
	}
	deadline := time.Now().Add(10 * time.Second)
	for succeeded() < 9 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := succeeded(); n != 9 {
		t.Fatalf("%d tasks succeeded while the runner held %s; want the other 9", n, held)
	}
	mu.Lock()
	if ran[held] != 0 {
		t.Fatalf("the worker ran %s while the runner held it", held)
	}
	mu.Unlock()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(10 * time.Second)
	for succeeded() < 10 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if n := succeeded(); n != 10 {
		t.Fatalf("%d tasks succeeded after the runner let %s go; want 10", n, held)
	}
	// The held task was claimed once its second out had passed: nothing
	// is left out any more, and an idle wait is the full safety net, not
	// a wait cut to nothing by the expired entry (a busy loop of claims).
	if d := queue.RunnerHeldWait(w, 30*time.Second); d != 30*time.Second {
		t.Fatalf("an idle wait after the runner's task ran is %v; want 30s", d)
	}
}
