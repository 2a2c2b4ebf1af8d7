package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// signalLog records, per task, what each step ran with.
type signalLog struct {
	mu   sync.Mutex
	runs map[string]int           // "task/step" -> runs
	got  map[string][]task.Signal // "task/step" -> signals received
}

func newSignalLog() *signalLog {
	return &signalLog{runs: map[string]int{}, got: map[string][]task.Signal{}}
}

func (l *signalLog) note(ctx context.Context, step string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	id := queue.TaskIDOf(ctx)
	l.runs[id+"/"+step]++
	if sg, ok := task.ReceivedSignal(ctx); ok {
		l.got[id+"/"+step] = append(l.got[id+"/"+step], sg)
	}
}

func (l *signalLog) count(id, step string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.runs[id+"/"+step]
}

func (l *signalLog) received(id, step string) []task.Signal {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got[id+"/"+step])
}

// waitingSteps are steps s1..sn: each step whose index is in waits ends
// with a wait for the signal "approval" (timeout); before is called at the
// start of s1 (nil: nothing).
func (l *signalLog) steps(n int, timeout time.Duration, before func(ctx context.Context), waits ...int) []task.Step {
	var out []task.Step
	for i := range n {
		name := fmt.Sprintf("s%d", i+1)
		out = append(out, task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			if i == 0 && before != nil {
				before(ctx)
			}
			l.note(ctx, name)
			state = append(append([]byte{}, state...), "|"+name...)
			if slices.Contains(waits, i) {
				return state, task.WaitSignal("approval", timeout)
			}
			return state, nil
		}})
	}
	return out
}

func submitOne(t *testing.T, c *queue.Client, id string) {
	t.Helper()
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: id, Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
}

func waitStatus(t *testing.T, c *queue.Client, id string, st queue.Status) *queue.Task {
	t.Helper()
	var got *queue.Task
	waitUntil(t, fmt.Sprintf("%s to be %s", id, st), func() bool {
		var err error
		got, err = c.Get(context.Background(), id)
		return err == nil && got.CurrentStatus == st
	})
	return got
}

// A step that waits parks its task WAITING (no claim, its wait in the
// record and the queue's wait index); a signal sent then wakes it at once,
// the next step gets the signal's data, and the task completes; each step
// runs once and the wait costs no attempt; the signal is consumed.
func TestWaitSignalWakesParkedTask(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	l := newSignalLog()
	submitOne(t, c, "agent-1")
	startSleepWorker(t, cli, ns, newStillClock(), l.steps(3, 0, nil, 0))
	ctx := context.Background()
	waitUntil(t, "the task to wait", func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st.Waiting == 1 && st.Running == 0
	})
	got, err := c.Get(ctx, "agent-1")
	if err != nil || got.CurrentStatus != queue.Waiting || got.WaitingFor == nil || !slices.Equal(got.WaitingFor.Signals, []string{"approval"}) ||
		!got.WaitingFor.Until.IsZero() || !got.ScheduledAt.Equal(queue.NoTimeout) {
		t.Fatalf("task %+v (%v): want WAITING for approval, no timeout", got, err)
	}
	page, err := c.List(ctx, "q", queue.Waiting, queue.ListOptions{})
	if err != nil || len(page.Tasks) != 1 || page.Tasks[0].ID != "agent-1" {
		t.Fatalf("list WAITING: %+v (%v)", page, err)
	}
	keys := keyspace.MustNew(ns)
	if g, _ := cli.Get(ctx, keys.QueueClaims("q"), clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
		t.Fatalf("%d claims while the task waits", g.Count)
	}
	res, err := c.Signal(ctx, "agent-1", "approval", json.RawMessage(`{"ok":true}`), "k1")
	if err != nil || !res.Stored || !res.Woke || res.Status != queue.Waiting {
		t.Fatalf("signal: %+v, %v: want stored and woke", res, err)
	}
	done := waitStatus(t, c, "agent-1", queue.Succeeded)
	if string(done.Result) != `"|s1|s2|s3"` && string(done.Result) != "|s1|s2|s3" {
		t.Fatalf("result %q", done.Result)
	}
	for _, s := range []string{"s1", "s2", "s3"} {
		if n := l.count("agent-1", s); n != 1 {
			t.Fatalf("step %s ran %d times, want once", s, n)
		}
	}
	if sg := l.received("agent-1", "s2"); len(sg) != 1 || sg[0].Name != "approval" || string(sg[0].Data) != `{"ok":true}` || sg[0].IdempotencyKey != "k1" {
		t.Fatalf("s2 received %+v", sg)
	}
	if done.RetriesAttempted != 0 || done.WaitingFor != nil {
		t.Fatalf("task %+v: want no retry charged and no wait left", done)
	}
	sigs, err := c.Signals(ctx, "agent-1")
	if err != nil || len(sigs) != 1 || !sigs[0].Consumed {
		t.Fatalf("signals %+v (%v): want one, consumed", sigs, err)
	}
	if _, err := c.Signal(ctx, "agent-1", "approval", nil, ""); !errors.Is(err, queue.ErrFinished) {
		t.Fatalf("signal to a finished task: %v, want ErrFinished", err)
	}
}

// A signal sent while the step that will wait for it still runs (before
// the park) is kept: the park finds it and hands the task back at once,
// and the next step gets it. The task never shows WAITING.
func TestWaitSignalSentBeforeThePark(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	l := newSignalLog()
	var sent queue.SignalResult
	var sendErr error
	before := func(ctx context.Context) {
		sent, sendErr = c.Signal(ctx, queue.TaskIDOf(ctx), "approval", json.RawMessage(`"early"`), "early")
	}
	submitOne(t, c, "agent-2")
	startSleepWorker(t, cli, ns, newStillClock(), l.steps(2, 0, before, 0))
	done := waitStatus(t, c, "agent-2", queue.Succeeded)
	if sendErr != nil || !sent.Stored || sent.Woke || sent.Status != queue.Running {
		t.Fatalf("signal sent from the running step: %+v, %v: want stored, not woken", sent, sendErr)
	}
	if l.count("agent-2", "s1") != 1 || l.count("agent-2", "s2") != 1 {
		t.Fatalf("steps ran %v, want each once", l.runs)
	}
	if sg := l.received("agent-2", "s2"); len(sg) != 1 || string(sg[0].Data) != `"early"` {
		t.Fatalf("s2 received %+v", sg)
	}
	for _, tr := range done.Transitions {
		if tr.Status == queue.Waiting {
			t.Fatalf("history %+v shows WAITING: the park should have handed the task back", done.Transitions)
		}
	}
	if done.RetriesAttempted != 0 {
		t.Fatalf("%d retries charged", done.RetriesAttempted)
	}
}

// Signals sent at random moments around the park of many tasks: every
// task completes, every second step runs once with its signal. Whichever
// of the send and the park commits first, nothing is missed.
func TestWaitSignalRacesThePark(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	l := newSignalLog()
	const n = 20
	pause := func(context.Context) { time.Sleep(time.Duration(rand.IntN(30)) * time.Millisecond) }
	var ts []queue.Task
	for i := range n {
		ts = append(ts, queue.Task{ID: fmt.Sprintf("race-%02d", i), Type: "agent"})
	}
	if _, err := c.Submit(context.Background(), "q", ts, nil); err != nil {
		t.Fatal(err)
	}
	startSleepWorker(t, cli, ns, newStillClock(), l.steps(2, 0, pause, 0))
	var wg sync.WaitGroup
	var woke atomic.Int32
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(rand.IntN(400)) * time.Millisecond)
			res, err := c.Signal(context.Background(), ts[i].ID, "approval", nil, "go")
			if err != nil {
				t.Errorf("signal %s: %v", ts[i].ID, err)
			}
			if res.Woke {
				woke.Add(1)
			}
		}()
	}
	wg.Wait()
	t.Logf("%d of %d signals woke a parked task; the others found it running or pending", woke.Load(), n)
	for _, tk := range ts {
		waitStatus(t, c, tk.ID, queue.Succeeded)
		if l.count(tk.ID, "s1") != 1 || l.count(tk.ID, "s2") != 1 || len(l.received(tk.ID, "s2")) != 1 {
			t.Fatalf("%s: s1 ran %d, s2 ran %d with %v; want once each, with the signal", tk.ID,
				l.count(tk.ID, "s1"), l.count(tk.ID, "s2"), l.received(tk.ID, "s2"))
		}
	}
}

// A wait that times out (on the movers' clock) goes back to pending; the
// next step gets a TimedOut signal.
func TestWaitTimesOut(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	start := clock.now()
	l := newSignalLog()
	submitOne(t, c, "agent-3")
	startSleepWorker(t, cli, ns, clock, l.steps(2, time.Second, nil, 0))
	got := waitStatus(t, c, "agent-3", queue.Waiting)
	if want := start.Add(time.Second); !got.ScheduledAt.Equal(want) || !got.WaitingFor.Until.Equal(want) {
		t.Fatalf("task %+v: want WAITING until %s", got, want)
	}
	clock.advance(2 * time.Second)
	waitStatus(t, c, "agent-3", queue.Succeeded)
	if sg := l.received("agent-3", "s2"); len(sg) != 1 || !sg[0].TimedOut || l.count("agent-3", "s2") != 1 {
		t.Fatalf("s2 received %+v: want one timeout", sg)
	}
}

// A consumed signal is not delivered to a later wait of the same name; a
// signal sent again with the same idempotency key stores and wakes
// nothing; a new key wakes the second wait.
func TestWaitSignalDeliveredOnce(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	l := newSignalLog()
	submitOne(t, c, "agent-4")
	startSleepWorker(t, cli, ns, newStillClock(), l.steps(3, 0, nil, 0, 1))
	ctx := context.Background()
	waitStatus(t, c, "agent-4", queue.Waiting)
	if res, err := c.Signal(ctx, "agent-4", "approval", json.RawMessage(`1`), "k1"); err != nil || !res.Woke {
		t.Fatalf("first signal: %+v, %v", res, err)
	}
	waitUntil(t, "the second wait", func() bool {
		got, err := c.Get(ctx, "agent-4")
		return err == nil && got.CurrentStatus == queue.Waiting && l.count("agent-4", "s2") == 1
	})
	res, err := c.Signal(ctx, "agent-4", "approval", json.RawMessage(`1`), "k1")
	if err != nil || res.Stored || res.Woke {
		t.Fatalf("the same signal again: %+v, %v: want nothing stored or woken", res, err)
	}
	if st, _ := c.Stats(ctx, "q"); st.Waiting != 1 {
		t.Fatalf("stats %+v: want the task still waiting", st)
	}
	if res, err = c.Signal(ctx, "agent-4", "approval", json.RawMessage(`2`), "k2"); err != nil || !res.Woke {
		t.Fatalf("second signal: %+v, %v", res, err)
	}
	waitStatus(t, c, "agent-4", queue.Succeeded)
	s2, s3 := l.received("agent-4", "s2"), l.received("agent-4", "s3")
	if len(s2) != 1 || s2[0].IdempotencyKey != "k1" || len(s3) != 1 || s3[0].IdempotencyKey != "k2" || l.count("agent-4", "s3") != 1 {
		t.Fatalf("s2 received %+v, s3 %+v: want k1 then k2, once each", s2, s3)
	}
}

// Cancelling a waiting task deletes its wait key; a signal to it then is
// ErrFinished. A bulk cancel and a purge of WAITING tasks do the same, and
// the purge deletes the task's signals.
func TestWaitCancelAndPurge(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	l := newSignalLog()
	for _, id := range []string{"w-1", "w-2", "w-3"} {
		submitOne(t, c, id)
	}
	stop := startSleepWorker(t, cli, ns, newStillClock(), l.steps(2, time.Hour, nil, 0))
	ctx := context.Background()
	waitUntil(t, "three waiting tasks", func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st.Waiting == 3
	})
	stop()
	if _, err := c.Signal(ctx, "w-3", "other", nil, "x"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, "w-1"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.CancelTasks(ctx, "q", queue.Waiting, []string{"w-2"}, nil); err != nil || n != 1 {
		t.Fatalf("bulk cancel: %d, %v", n, err)
	}
	if n, err := c.Purge(ctx, "q", queue.Waiting, nil, nil); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v", n, err)
	}
	keys := keyspace.MustNew(ns)
	for _, p := range []string{keys.QueueWait("q"), keys.Task("w-3")} {
		if g, _ := cli.Get(ctx, p, clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
			t.Fatalf("%d keys left under %s", g.Count, p)
		}
	}
	st, err := c.Stats(ctx, "q")
	if err != nil || st.Waiting != 0 || st.Cancelled != 2 {
		t.Fatalf("stats %+v (%v): want 2 cancelled, none waiting", st, err)
	}
	if _, err := c.Signal(ctx, "w-1", "approval", nil, ""); !errors.Is(err, queue.ErrFinished) {
		t.Fatalf("signal to a cancelled task: %v, want ErrFinished", err)
	}
}

// Bad signals change nothing and say what is wrong.
func TestSignalBadInput(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	submitOne(t, c, "ok")
	ctx := context.Background()
	if _, err := c.Signal(ctx, "nobody", "approval", nil, ""); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("unknown task: %v, want ErrNotFound", err)
	}
	for _, tc := range []struct {
		name, idem, field string
		data              string
	}{
		{"a/b", "", "signal name", ""},
		{"", "", "signal name", ""},
		{"approval", "k/1", "idempotency key", ""},
		{"approval", "", "data", "{not json"},
	} {
		_, err := c.Signal(ctx, "ok", tc.name, json.RawMessage(tc.data), tc.idem)
		var ie *drover.InputError
		if !errors.As(err, &ie) || ie.Field != tc.field {
			t.Fatalf("signal %q idem %q data %q: %v, want an input error naming %q", tc.name, tc.idem, tc.data, err, tc.field)
		}
	}
	if sigs, err := c.Signals(ctx, "ok"); err != nil || len(sigs) != 0 {
		t.Fatalf("signals %+v (%v): want none stored", sigs, err)
	}
}

// A wait for several names ends with the first of them sent; a signal of
// another name is kept and wakes nothing.
func TestWaitForOneOfSeveralSignals(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	l := newSignalLog()
	submitOne(t, c, "agent-5")
	steps := []task.Step{
		{Name: "s1", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			return s, task.WaitSignals(0, "approve", "reject")
		}},
		{Name: "s2", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			l.note(ctx, "s2")
			return s, nil
		}},
	}
	startSleepWorker(t, cli, ns, newStillClock(), steps)
	ctx := context.Background()
	got := waitStatus(t, c, "agent-5", queue.Waiting)
	if !slices.Equal(got.WaitingFor.Signals, []string{"approve", "reject"}) {
		t.Fatalf("waiting for %+v", got.WaitingFor)
	}
	if res, err := c.Signal(ctx, "agent-5", "comment", json.RawMessage(`"lgtm?"`), ""); err != nil || !res.Stored || res.Woke {
		t.Fatalf("a signal of another name: %+v, %v: want stored, not woken", res, err)
	}
	if res, err := c.Signal(ctx, "agent-5", "reject", nil, ""); err != nil || !res.Woke {
		t.Fatalf("reject: %+v, %v", res, err)
	}
	waitStatus(t, c, "agent-5", queue.Succeeded)
	if sg := l.received("agent-5", "s2"); len(sg) != 1 || sg[0].Name != "reject" {
		t.Fatalf("s2 received %+v: want reject", sg)
	}
	sigs, err := c.Signals(ctx, "agent-5")
	if err != nil || len(sigs) != 2 || sigs[0].Name != "comment" || sigs[0].Consumed || sigs[1].Name != "reject" || !sigs[1].Consumed {
		t.Fatalf("signals %+v (%v): want comment kept, reject consumed", sigs, err)
	}
}
