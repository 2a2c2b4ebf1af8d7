package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// putSignal stores signal name of task id under idem as a sender does.
func putSignal(t *testing.T, cli *clientv3.Client, ns, id, name, idem, data string) {
	t.Helper()
	k := keyspace.MustNew(ns).TaskSignal(id, name, idem)
	if _, err := cli.Put(context.Background(), k, task.EncodeSignal(json.RawMessage(data), time.Now())); err != nil {
		t.Fatal(err)
	}
}

// countKeys counts the keys under prefix.
func countKeys(t *testing.T, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count
}

// waitSteps are three steps: the first waits for "approval" (timeout),
// the second records what it received.
func waitSteps(runs map[string]int, timeout time.Duration, got *[]task.Signal) []task.Step {
	return []task.Step{
		{Name: "plan", Run: func(_ context.Context, s []byte) ([]byte, error) {
			runs["plan"]++
			return append(s, 'p'), task.WaitSignal("approval", timeout)
		}},
		{Name: "act", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			runs["act"]++
			sg, ok := task.ReceivedSignal(ctx)
			if ok {
				*got = append(*got, sg)
			}
			return append(s, 'a'), nil
		}},
		{Name: "report", Run: func(_ context.Context, s []byte) ([]byte, error) {
			runs["report"]++
			return append(s, 'r'), nil
		}},
	}
}

// A runner's step that waits: Run returns with Waiting and the lock
// released; a Run with no signal sent runs nothing; a Run after the
// signal was sent resumes at the next step with it, consumes it (inbox
// empty, one tombstone), and completes; each step runs once.
func TestRunnerStepWaitsForSignal(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	runs := map[string]int{}
	var got []task.Signal
	steps := waitSteps(runs, 0, &got)
	a, b := newRunner(t, ns, "a", 5*time.Second, nil), newRunner(t, ns, "b", 5*time.Second, nil)
	ctx := context.Background()
	res, err := a.Run(ctx, "approve", steps)
	if err != nil || res.Waiting == nil || res.StepsRun != 1 || res.Waiting.Signals[0] != "approval" || !res.Waiting.Until.IsZero() {
		t.Fatalf("first run: %+v, %v: want step 1 run and a wait for approval without timeout", res, err)
	}
	keys := keyspace.MustNew(ns)
	if n := countKeys(t, cli, keys.Lock(keyspace.TaskLock("approve"))); n != 0 {
		t.Fatalf("%d lock keys held while the task waits", n)
	}
	putSignal(t, cli, ns, "approve", "other", "k0", `1`) // not waited for
	if res, err = b.Run(ctx, "approve", steps); err != nil || res.StepsRun != 0 || res.Waiting == nil {
		t.Fatalf("run with no signal: %+v, %v: want nothing run", res, err)
	}
	putSignal(t, cli, ns, "approve", "approval", "k1", `{"ok":true}`)
	putSignal(t, cli, ns, "approve", "approval", "k2", `{"ok":false}`)
	if res, err = b.Run(ctx, "approve", steps); err != nil || res.StepsRun != 2 || string(res.State) != "par" || res.Waiting != nil {
		t.Fatalf("run after the signal: %+v, %v: want steps 2 and 3 run", res, err)
	}
	if len(got) != 1 || got[0].Name != "approval" || got[0].IdempotencyKey != "k1" || string(got[0].Data) != `{"ok":true}` || got[0].TimedOut {
		t.Fatalf("step 2 received %+v: want the first approval sent, k1", got)
	}
	if runs["plan"] != 1 || runs["act"] != 1 || runs["report"] != 1 {
		t.Fatalf("steps ran %v, want each once", runs)
	}
	sigs, err := a.Store().Signals(ctx, "approve")
	if err != nil {
		t.Fatal(err)
	}
	consumed := map[string]bool{}
	for _, s := range sigs {
		consumed[s.Name+"/"+s.IdempotencyKey] = s.Consumed
	}
	if len(sigs) != 3 || !consumed["approval/k1"] || consumed["approval/k2"] || consumed["other/k0"] {
		t.Fatalf("signals %+v: want k1 consumed, k2 and k0 waiting", sigs)
	}
}

// A wait whose timeout passed on the runner's clock resumes the next step
// with TimedOut; a signal sent after that stays in the inbox.
func TestRunnerWaitTimesOut(t *testing.T) {
	ns := etcdtest.Namespace(t)
	var clock atomic.Int64
	clock.Store(time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC).UnixNano())
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	r, err := task.NewRunner(context.Background(), srv.Client(t), task.RunnerConfig{Namespace: ns, WorkerID: "w", TTL: 5 * time.Second, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	runs := map[string]int{}
	var got []task.Signal
	steps := waitSteps(runs, time.Hour, &got)
	ctx := context.Background()
	res, err := r.Run(ctx, "late", steps)
	if err != nil || res.Waiting == nil || !res.Waiting.Until.Equal(now().Add(time.Hour)) {
		t.Fatalf("first run: %+v, %v: want a wait of an hour", res, err)
	}
	clock.Add(int64(time.Hour - task.SleepMargin - time.Nanosecond))
	if res, err = r.Run(ctx, "late", steps); err != nil || res.StepsRun != 0 || res.Waiting == nil {
		t.Fatalf("run before the timeout: %+v, %v: want nothing run", res, err)
	}
	clock.Add(int64(task.SleepMargin + time.Nanosecond))
	if res, err = r.Run(ctx, "late", steps); err != nil || res.StepsRun != 2 {
		t.Fatalf("run after the timeout: %+v, %v: want steps 2 and 3 run", res, err)
	}
	if len(got) != 1 || !got[0].TimedOut || got[0].Name != "" {
		t.Fatalf("step 2 received %+v: want a timeout", got)
	}
}

// A run that lost its lock while the step that received a signal ran
// consumes nothing: its checkpoint is refused, the signal stays in the
// inbox, and the next holder's step gets it and consumes it, once.
func TestWaitSignalNotConsumedWithoutTheFence(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	a := newRunner(t, ns, "a", 5*time.Second, nil)
	ctx := context.Background()
	runs := map[string]int{}
	var got []task.Signal
	steps := waitSteps(runs, 0, &got)
	if _, err := a.Run(ctx, "fenced", steps); err != nil {
		t.Fatal(err)
	}
	putSignal(t, cli, ns, "fenced", "approval", "k1", `"yes"`)
	lost := append([]task.Step(nil), steps...)
	lost[1].Run = func(ctx context.Context, s []byte) ([]byte, error) {
		if _, err := cli.Revoke(context.Background(), a.Lease().ID()); err != nil {
			return nil, err
		}
		<-ctx.Done() // the lock is gone
		return append(s, 'x'), nil
	}
	if _, err := a.Run(ctx, "fenced", lost); err == nil {
		t.Fatal("a run whose lock was lost completed its step")
	}
	keys := keyspace.MustNew(ns)
	if in, seen := countKeys(t, cli, keys.TaskSignals("fenced")), countKeys(t, cli, keys.TaskSignalsSeen("fenced")); in != 1 || seen != 0 {
		t.Fatalf("after the lost run: %d signals in the inbox, %d consumed; want 1 and 0", in, seen)
	}
	b := newRunner(t, ns, "b", 5*time.Second, nil)
	if res, err := b.Run(ctx, "fenced", steps); err != nil || string(res.State) != "par" {
		t.Fatalf("next run: %+v, %v", res, err)
	}
	if len(got) != 1 || got[0].IdempotencyKey != "k1" {
		t.Fatalf("received %+v: want k1 once", got)
	}
	if in, seen := countKeys(t, cli, keys.TaskSignals("fenced")), countKeys(t, cli, keys.TaskSignalsSeen("fenced")); in != 0 || seen != 1 {
		t.Fatalf("after the next run: %d signals in the inbox, %d consumed; want 0 and 1", in, seen)
	}
}

// A bad wait fails its step with an input error naming it; nothing is
// checkpointed.
func TestRunnerBadWait(t *testing.T) {
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	for _, tc := range []struct {
		name  string
		req   error
		field string
	}{
		{"bad name", task.WaitSignal("a/b", 0), "signal name"},
		{"no name", task.WaitSignals(time.Minute), "wait signals"},
		{"twice", task.WaitSignals(0, "a", "a"), "signal name"},
		{"negative", task.WaitSignal("a", -time.Second), "wait timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "bad-" + strings.ReplaceAll(tc.name, " ", "-")
			_, err := r.Run(context.Background(), id, []task.Step{
				{Name: "one", Run: func(context.Context, []byte) ([]byte, error) { return []byte("x"), tc.req }},
				{Name: "two", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }},
			})
			var ie *drover.InputError
			if !errors.As(err, &ie) || !errors.Is(err, task.ErrStepFailed) || ie.Field != tc.field {
				t.Fatalf("err %v: want a step failure naming %q", err, tc.field)
			}
			if cp, _ := r.Store().Load(context.Background(), id); cp.Step != 0 {
				t.Fatalf("checkpoint %+v written", cp)
			}
		})
	}
}
