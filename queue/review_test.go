package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// Cancels racing with a draining worker: every task ends in exactly one
// terminal state.
func TestCancelRacingWithOutcomes(t *testing.T) {
	const n = 1500
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", tasks(n, "work"), nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 32, Drain: true})
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) { return []byte("r"), nil })
	done := make(chan struct{})
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < n; i += 8 {
				select {
				case <-done:
					return
				default:
				}
				_, _ = c.Cancel(context.Background(), fmt.Sprintf("t-%05d", i))
			}
		}()
	}
	runDrain(t, w)
	close(done)
	wg.Wait()
	st, err := c.Stats(context.Background(), "jobs")
	if err != nil || st.Total() != n || st.Unfinished() != 0 {
		t.Fatalf("stats %+v (%v): want %d tasks, each in one terminal state", st, err, n)
	}
	seen := map[string]string{}
	for _, status := range []queue.Status{queue.Succeeded, queue.Cancelled} {
		after := ""
		for {
			p, err := c.List(context.Background(), "jobs", status, queue.ListOptions{Limit: 1000, After: after})
			if err != nil {
				t.Fatal(err)
			}
			for _, task := range p.Tasks {
				if prev, dup := seen[task.ID]; dup {
					t.Fatalf("task %s is both %s and %s", task.ID, prev, status)
				}
				seen[task.ID] = string(status)
			}
			if after = p.Next; after == "" {
				break
			}
		}
	}
	for id, k := range succeededIDs(t, c, cli, ns, "jobs") {
		if k != 1 {
			t.Fatalf("%s was recorded as SUCCEEDED %d times", id, k)
		}
	}
	if len(seen) != n {
		t.Fatalf("%d tasks finished, want %d", len(seen), n)
	}
}

// Large results, which no single request can carry a hundred of, all get
// recorded; and ids repeated within one submission count as duplicates.
func TestLargeResultsAndRepeatedIDs(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	in := tasks(40, "big")
	in = append(in, in[3], in[7]) // repeated within the batch
	big := json.RawMessage(`{"blob":"` + strings.Repeat("p", 60000) + `"}`)
	for i := range in {
		in[i].Parameters = big
	}
	res, err := c.Submit(context.Background(), "jobs", in, nil)
	if err != nil || res.Submitted != 40 || res.Duplicates != 2 {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 40, Prefetch: 40, Drain: true})
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
		return []byte(strings.Repeat("r", 200<<10)), nil
	})
	runDrain(t, w)
	if st, _ := c.Stats(context.Background(), "jobs"); st.Succeeded != 40 {
		t.Fatalf("stats %+v", st)
	}
}

// Workers that keep losing claim races to each other still keep busy: the
// tasks run in rounds in which all four workers must each hold one at once,
// so a worker that stops claiming after a lost race, or gives up while tasks
// are pending, stalls a round (counted, not timed against the machine).
func TestContendedWorkersStayBusy(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	const workers, rounds = 4, 20
	if _, err := c.Submit(context.Background(), "jobs", tasks(workers*rounds, "work"), nil); err != nil {
		t.Fatal(err)
	}
	var (
		mu      sync.Mutex
		arrived int
		release = make(chan struct{})
		stalled atomic.Int32
		ran     [workers]atomic.Int32
	)
	// meet blocks until all workers hold a task, or a minute has passed (a
	// stall: only a worker that stopped claiming leaves a round short).
	meet := func() {
		mu.Lock()
		ch := release
		if arrived++; arrived == workers {
			arrived, release = 0, make(chan struct{})
			close(ch)
		}
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(time.Minute):
			stalled.Add(1)
		}
	}
	var wg sync.WaitGroup
	for i := 0; i < workers; i++ {
		w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 1, Drain: true})
		w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
			ran[i].Add(1)
			meet()
			// Long enough that a worker claims nothing ahead of its one
			// slot (WorkerConfig.Prefetch): no worker holds a round's task
			// another one needs.
			time.Sleep(100 * time.Millisecond)
			return nil, nil
		})
		wg.Add(1)
		go func() { defer wg.Done(); runDrain(t, w) }()
	}
	wg.Wait()
	if n := stalled.Load(); n > 0 {
		t.Fatalf("%d waits for all %d workers to hold a task stalled a minute", n, workers)
	}
	for i := range ran {
		if n := ran[i].Load(); n != rounds {
			t.Fatalf("worker %d ran %d tasks, want %d (one a round)", i, n, rounds)
		}
	}
}
