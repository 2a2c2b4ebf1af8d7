package queue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// barrier releases its callers once n of them have arrived.
type barrier struct {
	mu   sync.Mutex
	n    int
	open chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, open: make(chan struct{})} }

func (b *barrier) arrive(ctx context.Context) {
	b.mu.Lock()
	b.n--
	if b.n == 0 {
		close(b.open)
	}
	b.mu.Unlock()
	select {
	case <-b.open:
	case <-ctx.Done():
	}
}

// The outcomes of one segment's run, 60 tasks that fail and 40 that wait
// for 16 signals each, ending together, fit etcd's operation limit
// along every nesting path (a wait's conditional park is one level more):
// every task ends DEAD or WAITING, none stays RUNNING.
func TestWaitParksOfOneRunWithinTheTxnLimit(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	none := 0
	in := make([]queue.Task, 100)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t-%03d", i), Type: "agent", MaxRetries: &none}
	}
	if _, err := c.Submit(ctx, "q", in, nil); err != nil {
		t.Fatal(err)
	}
	names := make([]string, task.MaxWaitSignals)
	for i := range names {
		names[i] = fmt.Sprintf("signal-%02d", i)
	}
	step := task.Step{Name: "s1", Run: func(ctx context.Context, state []byte) ([]byte, error) {
		if queue.TaskIDOf(ctx) < "t-060" {
			return state, errors.New("fails")
		}
		return state, task.WaitSignals(0, names...)
	}}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: len(in)})
	steps := queue.Steps(store, step, task.Step{Name: "s2", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }})
	// Every task's outcome is handed to the writer at once, so that the
	// run's outcomes are written together.
	b := newBarrier(len(in))
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		res, err := steps(ctx, tk)
		b.arrive(context.Background())
		return res, err
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = w.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "60 tasks DEAD and 40 WAITING", func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st.Dead == 60 && st.Waiting == 40 && st.Running == 0
	})
	got, err := c.Get(ctx, "t-070")
	if err != nil || got.WaitingFor == nil || strings.Join(got.WaitingFor.Signals, ",") != strings.Join(names, ",") {
		t.Fatalf("t-070: %+v (%v): want waiting for the 16 signals", got, err)
	}
}

// A run's outcomes refused because another task of its segment was
// cancelled while it ran are written again (exact): a wait among them is
// recorded once, its attempt given back once and its history written
// once, however many times its writes were made.
func TestWaitRecordedAgainCountsOnce(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "q", []queue.Task{{ID: "a", Type: "agent"}, {ID: "b", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	cancelled := make(chan struct{})
	step := task.Step{Name: "s1", Run: func(ctx context.Context, state []byte) ([]byte, error) {
		if queue.TaskIDOf(ctx) == "b" {
			if _, err := c.Cancel(context.Background(), "b"); err != nil {
				t.Error(err)
			}
			close(cancelled)
			<-ctx.Done()
			return state, ctx.Err()
		}
		<-cancelled
		return state, task.WaitSignal("approval", 0)
	}}
	startSleepWorker(t, cli, ns, newStillClock(), []task.Step{step, {Name: "s2", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }}})
	got := waitStatus(t, c, "a", queue.Waiting)
	waits := 0
	for _, tr := range got.Transitions {
		if tr.Status == queue.Waiting {
			waits++
		}
	}
	if got.Attempt != 0 || waits != 1 {
		t.Fatalf("a: attempt %d, %d WAITING transitions (%+v): want attempt 0 and one", got.Attempt, waits, got.Transitions)
	}
}

// A search without a status finds the tasks parked waiting and sleeping,
// as a search for their status does.
func TestSearchFindsWaitingAndSleepingTasks(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "q", []queue.Task{{ID: "nap", Type: "agent"}, {ID: "wait", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	step := task.Step{Name: "s1", Run: func(ctx context.Context, state []byte) ([]byte, error) {
		if queue.TaskIDOf(ctx) == "nap" {
			return state, task.Sleep(time.Hour)
		}
		return state, task.WaitSignal("approval", 0)
	}}
	startSleepWorker(t, cli, ns, newStillClock(), []task.Step{step, {Name: "s2", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }}})
	waitStatus(t, c, "nap", queue.Sleeping)
	waitStatus(t, c, "wait", queue.Waiting)
	for _, st := range []queue.Status{"", queue.Sleeping, queue.Waiting} {
		ids := searchAll(t, c, "q", queue.SearchQuery{Status: st})
		want := map[queue.Status]string{"": "nap,wait", queue.Sleeping: "nap", queue.Waiting: "wait"}[st]
		if slices.Sort(ids); strings.Join(ids, ",") != want {
			t.Fatalf("search status %q found %v, want %s", st, ids, want)
		}
	}
}

// A draining worker does not end while a wait that timed out is due: it
// resumes the task first (the wait's timeout passed by its clock).
func TestDrainResumesATimedOutWait(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	clock := newStillClock()
	submitOne(t, c, "agent-1")
	l := newSignalLog()
	steps := l.steps(2, time.Minute, nil, 0)
	stop := startSleepWorker(t, cli, ns, clock, steps)
	waitStatus(t, c, "agent-1", queue.Waiting)
	stop()
	clock.advance(2 * time.Minute)
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1, Drain: true})
	queue.SetWorkerClock(w, clock.now)
	w.HandleAll(queue.Steps(store, steps...))
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := c.Get(ctx, "agent-1")
	if err != nil || got.CurrentStatus != queue.Succeeded || l.count("agent-1", "s2") != 1 {
		t.Fatalf("after the drain: %+v (%v), s2 ran %d times: want SUCCEEDED, s2 once", got, err, l.count("agent-1", "s2"))
	}
}

// A task's inbox holds at most MaxInboxSignals signals not yet consumed:
// a new one past it is refused with ErrInboxFull, naming the bound, and
// stores nothing; a send again of one stored passes, writing nothing.
func TestSignalRefusedWhenTheInboxIsFull(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	ctx := context.Background()
	submitOne(t, c, "agent-1")
	for i := range queue.MaxInboxSignals {
		if _, err := c.Signal(ctx, "agent-1", "note", nil, fmt.Sprintf("k%04d", i)); err != nil {
			t.Fatalf("signal %d: %v", i, err)
		}
	}
	_, err := c.Signal(ctx, "agent-1", "note", nil, "one-more")
	if !errors.Is(err, queue.ErrInboxFull) || !strings.Contains(err.Error(), fmt.Sprint(queue.MaxInboxSignals)) {
		t.Fatalf("signal past the bound: %v, want ErrInboxFull naming %d", err, queue.MaxInboxSignals)
	}
	if res, err := c.Signal(ctx, "agent-1", "note", nil, "k0007"); err != nil || res.Stored {
		t.Fatalf("signal sent again: %+v, %v: want nothing stored, no error", res, err)
	}
	sigs, err := c.Signals(ctx, "agent-1")
	if err != nil || len(sigs) != queue.MaxInboxSignals {
		t.Fatalf("%d signals (%v), want %d", len(sigs), err, queue.MaxInboxSignals)
	}
}

// A task woken by a signal, not yet run again, reads PENDING with no wait
// left: what it waited for is shown only while it is WAITING.
func TestWaitWokenTaskShowsNoWait(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	submitOne(t, c, "agent-1")
	l := newSignalLog()
	stop := startSleepWorker(t, cli, ns, newStillClock(), l.steps(2, time.Hour, nil, 0))
	if got := waitStatus(t, c, "agent-1", queue.Waiting); got.WaitingFor == nil {
		t.Fatalf("WAITING with no wait: %+v", got)
	}
	stop()
	if res, err := c.Signal(ctx, "agent-1", "approval", nil, "k1"); err != nil || !res.Woke {
		t.Fatalf("signal: %+v, %v: want woke", res, err)
	}
	got, err := c.Get(ctx, "agent-1")
	if err != nil || got.CurrentStatus != queue.Pending || got.WaitingFor != nil {
		t.Fatalf("woken: %+v (%v): want PENDING, no wait", got, err)
	}
}
