package queue_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/etcdtest"
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
