package queue_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// runCounted runs n tasks through one worker at concurrency 4 whose handler
// takes d, and returns the most handlers that ran at once and the most
// tasks the queue showed RUNNING (claimed, or finished with the outcome
// not yet written) at once.
func runCounted(t *testing.T, n, prefetch int, d time.Duration) (handlers, claimed int64) {
	t.Helper()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	q := "ahead"
	submitN(t, c, q, n, nil)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 4, Prefetch: prefetch, Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	var now, most atomic.Int64
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		k := now.Add(1)
		for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
		}
		time.Sleep(d)
		now.Add(-1)
		return nil, nil
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var peak int64
	for {
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
			st, _ := c.Stats(ctx, q)
			if st.Succeeded != int64(n) {
				t.Fatalf("stats %+v, want %d succeeded", st, n)
			}
			return most.Load(), peak
		case <-time.After(20 * time.Millisecond):
			if st, err := c.Stats(ctx, q); err == nil {
				peak = max(peak, st.Running)
			}
		}
	}
}

// Short tasks are claimed ahead of a free running slot (claims' round
// trips overlap the work), but never more run at once than the
// concurrency.
func TestShortTasksClaimedAheadRunWithinConcurrency(t *testing.T) {
	// Prefetch 12: up to 16 claimed; without claiming ahead at most 4,
	// plus the few finished whose outcome is not written yet.
	handlers, claimed := runCounted(t, 400, 12, time.Millisecond)
	if handlers > 4 {
		t.Fatalf("%d handlers ran at once, concurrency 4", handlers)
	}
	if claimed <= 8 {
		t.Fatalf("at most %d tasks claimed at once: short tasks were not claimed ahead", claimed)
	}
	t.Logf("short tasks: at most %d handlers at once, %d claimed", handlers, claimed)
}

// Long tasks are not claimed ahead: the worker holds no more tasks than it
// runs, so that it does not sit on tasks other workers could run. Tasks of
// 300 ms at concurrency 4 would need claims of 75 ms for one to be.
func TestLongTasksNotClaimedAhead(t *testing.T) {
	// Prefetch 12: claimed ahead, the worker would hold up to 16.
	handlers, claimed := runCounted(t, 16, 12, 300*time.Millisecond)
	if handlers > 4 {
		t.Fatalf("%d handlers ran at once, concurrency 4", handlers)
	}
	if claimed > 8 {
		t.Fatalf("the queue showed %d tasks RUNNING at once with concurrency 4 and tasks of 300 ms: claimed ahead", claimed)
	}
}

// A task claimed ahead and waiting for a running slot is cancelled like a
// running one: its handler never starts.
func TestTaskCancelledWhileWaitingNeverStarts(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	q := "ahead-cancel"
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, Prefetch: 8})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(context.Background())
	// How many tasks a claim takes ahead is decided by the task and claim
	// times the worker measures: on a loaded machine it may take none, and
	// then nothing would wait to be cancelled. The worker here claims all
	// it may ahead.
	queue.ClaimAllAhead(w)
	started := make(chan string, 64)
	release := make(chan struct{})
	var blocking atomic.Bool
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		started <- tk.ID
		if strings.HasPrefix(tk.ID, "batch-") && blocking.CompareAndSwap(false, true) {
			<-release // the first of the batch holds the only running slot
		}
		return nil, nil
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(runCtx) }()
	var releaseOnce sync.Once
	let := func() { releaseOnce.Do(func() { close(release) }) }
	// A failure must not leave the held task blocking the worker's stop.
	defer func() { let(); stop(); <-done }()
	// Short tasks first, so that the worker claims ahead.
	warm := make([]queue.Task, 20)
	for i := range warm {
		warm[i] = queue.Task{ID: fmt.Sprintf("warm-%d", i), Type: "t"}
	}
	if _, err := c.Submit(ctx, q, warm, nil); err != nil {
		t.Fatal(err)
	}
	for range warm {
		<-started
	}
	batch := make([]queue.Task, 6)
	for i := range batch {
		batch[i] = queue.Task{ID: fmt.Sprintf("batch-%d", i), Type: "t"}
	}
	if _, err := c.Submit(ctx, q, batch, nil); err != nil {
		t.Fatal(err)
	}
	first := <-started
	// Wait until the worker holds a task of the batch besides the running
	// one: claimed ahead, waiting for the only slot; one will do.
	victim := ""
	deadline := time.Now().Add(30 * time.Second)
	for victim == "" {
		for _, tk := range batch {
			if got, err := c.Get(ctx, tk.ID); err == nil && tk.ID != first && got.CurrentStatus == queue.Running {
				victim = tk.ID
				break
			}
		}
		if victim == "" && time.Now().After(deadline) {
			st, _ := c.Stats(ctx, q)
			t.Fatalf("the worker claimed no task of the batch ahead (stats %+v)", st)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := c.Cancel(ctx, victim); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the cancel reaches the worker
	let()
	ran := map[string]bool{first: true}
	for len(ran) < 5 {
		select {
		case id := <-started:
			ran[id] = true
		case <-time.After(5 * time.Second):
			t.Fatalf("only %v ran", ran)
		}
	}
	if ran[victim] {
		t.Fatalf("%s was cancelled while it waited and still ran", victim)
	}
	select {
	case id := <-started:
		t.Fatalf("%s ran after the rest of the batch", id)
	case <-time.After(300 * time.Millisecond):
	}
	got, err := c.Get(ctx, victim)
	if err != nil || got.CurrentStatus != queue.Cancelled {
		t.Fatalf("%s: %+v, %v; want CANCELLED", victim, got, err)
	}
}

// Tasks of 5 ms or more are claimed ahead only as many as the running
// slots finish during one claim's round trip, so that a task so held waits
// no longer than a claim would take.
func TestAheadCoversOneClaim(t *testing.T) {
	for _, c := range []struct {
		task, claim    time.Duration
		conc, prefetch int
		want           int
	}{
		{50 * time.Millisecond, 40 * time.Millisecond, 2, 2, 1},   // 1.6 tasks end during a claim
		{50 * time.Millisecond, 60 * time.Millisecond, 2, 2, 2},   // 2.4, at most Prefetch
		{50 * time.Millisecond, 60 * time.Millisecond, 2, 100, 2}, // 2.4
		{10 * time.Millisecond, 20 * time.Millisecond, 8, 100, 16},
		{10 * time.Millisecond, 20 * time.Millisecond, 8, 8, 8},
		{300 * time.Millisecond, 20 * time.Millisecond, 4, 12, 0}, // long tasks: none
		{time.Minute, time.Second, 100, 100, 1},
		{time.Minute, 500 * time.Millisecond, 100, 100, 0},
		{0, time.Second, 4, 4, 0}, // no average yet
	} {
		if got := queue.AheadFor(c.task, c.claim, c.conc, c.prefetch); got != c.want {
			t.Errorf("tasks of %s, claims of %s, concurrency %d, prefetch %d: %d ahead, want %d", c.task, c.claim, c.conc, c.prefetch, got, c.want)
		}
	}
}
