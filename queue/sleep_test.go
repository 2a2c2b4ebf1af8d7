package queue_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stillClock is a clock that stands still until moved. A due index
// sleeps on a real timer for the time its clock says is left, so these
// tests sleep a second at most: the timer fires within a second of real
// time whatever the clock says, and only then does the clock decide.
type stillClock struct{ ns atomic.Int64 }

func newStillClock() *stillClock {
	c := &stillClock{}
	c.ns.Store(time.Now().Truncate(time.Millisecond).UnixNano())
	return c
}
func (c *stillClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *stillClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// stepCounter counts each step's runs, across workers.
type stepCounter struct {
	mu   sync.Mutex
	runs map[string]int
}

func (s *stepCounter) count(name string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[name]
}

// sleepySteps are three steps; the first ends with a sleep of d.
func (s *stepCounter) steps(d time.Duration) []task.Step {
	s.runs = map[string]int{}
	var out []task.Step
	for i, name := range []string{"s1", "s2", "s3"} {
		out = append(out, task.Step{Name: name, Run: func(_ context.Context, state []byte) ([]byte, error) {
			s.mu.Lock()
			s.runs[name]++
			s.mu.Unlock()
			state = append(append([]byte{}, state...), "|"+name...)
			if i == 0 {
				return state, task.Sleep(d)
			}
			return state, nil
		}})
	}
	return out
}

// startWorker runs a worker of queue q on clock until the test ends.
func startSleepWorker(t *testing.T, cli *clientv3.Client, ns string, clock *stillClock, steps []task.Step) (stop func()) {
	t.Helper()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 2})
	queue.SetWorkerClock(w, clock.now)
	w.HandleAll(queue.Steps(store, steps...))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			<-done
			_ = w.Close(context.Background())
		})
	}
	t.Cleanup(stop)
	return stop
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A step that sleeps parks its task: SLEEPING in stats and lists with its
// due time, no claim, no run, no lock held, not resumed while the mover's
// clock is before its due time whatever real time passes, and resumed at
// the next step once the clock reaches it, by another worker (the first
// is gone): every step runs once and the sleep costs no attempt.
func TestStepSleepParksAndResumes(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	start := clock.now()
	var sc stepCounter
	steps := sc.steps(time.Second)
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "agent-1", Type: "agent", Parameters: []byte(`"in"`)}}, nil); err != nil {
		t.Fatal(err)
	}
	stop := startSleepWorker(t, cli, ns, clock, steps)
	ctx := context.Background()
	waitUntil(t, "the task to sleep", func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st.Sleeping == 1
	})
	got, err := c.Get(ctx, "agent-1")
	if err != nil || got.CurrentStatus != queue.Sleeping || !got.ScheduledAt.Equal(start.Add(time.Second)) {
		t.Fatalf("task %+v (%v): want SLEEPING until %s", got, err, start.Add(time.Second))
	}
	page, err := c.List(ctx, "q", queue.Sleeping, queue.ListOptions{})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != "agent-1" {
		t.Fatalf("list SLEEPING: %+v (%v)", page, err)
	}
	// Parked: no claim, no run of a segment, no task lock held.
	keys := keyspace.MustNew(ns)
	for _, p := range []string{keys.QueueClaims("q"), keys.Runs("q", ""), keys.Lock(keyspace.TaskLock("agent-1"))} {
		if g, _ := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
			t.Fatalf("%d keys under %s while the task sleeps", g.Count, p)
		}
	}
	// No etcd lease has a key of the task, or of a claim of the queue.
	leases, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range leases.Leases {
		ttl, err := cli.TimeToLive(ctx, l.ID, clientv3.WithAttachedKeys())
		if err != nil {
			continue // expired meanwhile
		}
		for _, k := range ttl.Keys {
			if key := string(k); strings.Contains(key, "agent-1") || strings.HasPrefix(key, keys.Queue("q")) {
				t.Fatalf("lease %x holds %s while the task sleeps", l.ID, key)
			}
		}
	}
	// Not resumed before its time on the mover's clock: real time passes
	// (more than the sleep), the clock does not.
	time.Sleep(1500 * time.Millisecond)
	if st, _ := c.Stats(ctx, "q"); st.Sleeping != 1 || sc.count("s2") != 0 {
		t.Fatalf("resumed before its time: stats %+v, s2 ran %d times", st, sc.count("s2"))
	}
	stop()
	clock.advance(999 * time.Millisecond)
	startSleepWorker(t, cli, ns, clock, steps)
	time.Sleep(300 * time.Millisecond)
	if sc.count("s2") != 0 {
		t.Fatal("resumed 1 ms before its time")
	}
	clock.advance(time.Millisecond)
	var done *queue.Task
	waitUntil(t, "the task to finish", func() bool {
		done, err = c.Get(ctx, "agent-1")
		return err == nil && done.CurrentStatus.Terminal()
	})
	if done.CurrentStatus != queue.Succeeded || string(done.Result) != `"in"|s1|s2|s3` || done.Attempt != 1 {
		t.Fatalf("task %+v: want SUCCEEDED with every step's mark, attempt 1", done)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if n := sc.count(s); n != 1 {
			t.Fatalf("step %s ran %d times, want once", s, n)
		}
	}
	slept := false
	for _, tr := range done.Transitions {
		slept = slept || tr.Status == queue.Sleeping
	}
	if !slept {
		t.Fatalf("no SLEEPING transition in %+v", done.Transitions)
	}
	if st, _ := c.Stats(ctx, "q"); st.Sleeping != 0 || st.Succeeded != 1 {
		t.Fatalf("stats %+v", st)
	}
}

// A sleeping task can be cancelled, one by one or all of them, and purged:
// it never resumes.
func TestCancelSleepingTask(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	var sc stepCounter
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "a", Type: "agent"}, {ID: "b", Type: "agent"}, {ID: "c", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	startSleepWorker(t, cli, ns, clock, sc.steps(time.Hour))
	ctx := context.Background()
	waitUntil(t, "the tasks to sleep", func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st.Sleeping == 3
	})
	if n, err := c.Purge(ctx, "q", queue.Sleeping, []string{"c"}, nil); err != nil || n != 1 {
		t.Fatalf("purge c: %d, %v", n, err)
	}
	if got, err := c.Cancel(ctx, "a"); err != nil || got.ID != "a" {
		t.Fatalf("cancel a: %+v, %v", got, err)
	}
	if n, err := c.CancelTasks(ctx, "q", queue.Sleeping, nil, nil); err != nil || n != 1 {
		t.Fatalf("cancel the sleeping: %d, %v", n, err)
	}
	clock.advance(2 * time.Hour)
	st, err := c.Stats(ctx, "q")
	if err != nil || st.Cancelled != 2 || st.Sleeping != 0 || st.Pending != 0 {
		t.Fatalf("stats %+v (%v)", st, err)
	}
	time.Sleep(500 * time.Millisecond)
	if sc.count("s2") != 0 {
		t.Fatal("a cancelled task resumed")
	}
	if g, _ := cli.Get(ctx, keyspace.MustNew(ns).QueueSleep("q"), clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
		t.Fatalf("%d sleep keys left", g.Count)
	}
}

// A negative sleep is refused: the task goes to the dead-letter queue
// naming the sleep, and the step's state is not checkpointed.
func TestNegativeSleepIsRefused(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	var sc stepCounter
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "neg", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	startSleepWorker(t, cli, ns, clock, sc.steps(-time.Second))
	var got *queue.Task
	waitUntil(t, "the task to end", func() bool {
		var err error
		got, err = c.Get(context.Background(), "neg")
		return err == nil && got.CurrentStatus.Terminal()
	})
	if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "sleep") || !strings.Contains(got.LastError, "must not be negative") {
		t.Fatalf("task %+v: want DEAD naming the sleep", got)
	}
	store, _ := task.NewStore(cli, ns)
	if cp, _ := store.Load(context.Background(), "neg"); cp.Step != 0 {
		t.Fatalf("checkpoint %+v written for a refused sleep", cp)
	}
}

// A handler without steps that returns task.Sleep parks its task, which
// runs again whole when the sleep ends on the mover's clock, its attempt
// not counted.
func TestHandlerSleepRunsAgain(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "poll", Type: "poll"}}, nil); err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int32
	// Not Drain: a draining worker does not wait for a sleeping task.
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	queue.SetWorkerClock(w, clock.now)
	w.HandleAll(func(_ context.Context, tk *queue.Task) ([]byte, error) {
		if runs.Add(1) == 1 {
			return nil, task.SleepUntil(clock.now().Add(time.Second))
		}
		return []byte(strconv.Itoa(tk.Attempt)), nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	waitUntil(t, "the task to sleep", func() bool {
		st, err := c.Stats(context.Background(), "q")
		return err == nil && st.Sleeping == 1
	})
	clock.advance(time.Second)
	waitUntil(t, "the task to succeed", func() bool {
		g, err := c.Get(context.Background(), "poll")
		return err == nil && g.CurrentStatus == queue.Succeeded
	})
	cancel()
	<-done
	got, err := c.Get(context.Background(), "poll")
	if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != "1" || runs.Load() != 2 {
		t.Fatalf("task %+v (%v), %d runs: want SUCCEEDED on attempt 1 after two runs", got, err, runs.Load())
	}
}

// A worker whose lease ends after a step's checkpoint with its sleep was
// written, before the outcome that parks the task: the next attempt finds
// the sleep in the checkpoint and parks the task again, running nothing,
// and it resumes at the next step when the sleep ends.
func TestSleepCheckpointedButNotParked(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	var sc stepCounter
	steps := sc.steps(time.Minute) // beyond task.SleepMargin: not waited out in-process
	store, _ := task.NewStore(cli, ns)
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "gap", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	a := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	queue.SetWorkerClock(a, clock.now)
	checkpointed := make(chan struct{})
	inner := queue.Steps(store, steps...)
	a.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		out, err := inner(ctx, tk)
		close(checkpointed)
		<-ctx.Done() // dies before its outcome is written
		return out, err
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = a.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	<-checkpointed
	if _, err := cli.Revoke(context.Background(), a.Lease().ID()); err != nil {
		t.Fatal(err)
	}
	startSleepWorker(t, cli, ns, clock, steps)
	waitUntil(t, "the task to be parked again", func() bool {
		got, err := c.Get(context.Background(), "gap")
		return err == nil && got.CurrentStatus == queue.Sleeping
	})
	if sc.count("s1") != 1 || sc.count("s2") != 0 {
		t.Fatalf("steps ran %v before the sleep ended", sc.runs)
	}
	clock.advance(time.Minute)
	// The worker's mover waits a minute of real time on its timer: move
	// the task now, on the same clock.
	n, err := queue.MoveSleeps(context.Background(), c, "q", clock.now)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 { // the worker's own mover, on the same clock, may have moved it first
		got, err := c.Get(context.Background(), "gap")
		if err != nil || got.CurrentStatus == queue.Sleeping {
			keys, _ := cli.Get(context.Background(), keyspace.MustNew(ns).QueueSleep("q"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			t.Fatalf("moved %d, want 1; the task: %+v (%v); sleep keys %v", n, got, err, keys.Kvs)
		}
	}
	waitUntil(t, "the task to finish", func() bool {
		got, err := c.Get(context.Background(), "gap")
		return err == nil && got.CurrentStatus == queue.Succeeded
	})
	for _, s := range []string{"s1", "s2", "s3"} {
		if n := sc.count(s); n != 1 {
			t.Fatalf("step %s ran %d times, want once", s, n)
		}
	}
}
