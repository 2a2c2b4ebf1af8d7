package task_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// A signal ends a wait; the step after it fails once, so its checkpoint
// does not commit and the signal stays unconsumed; the run after that
// gets the signal again and commits. The wait is one "await signal" span,
// recorded by the run whose checkpoint consumed it, ending as its step
// started.
func TestSignalWaitSpanOncePerCheckpoint(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	fails := 1
	steps := []task.Step{
		{Name: "ask", Run: func(context.Context, []byte) ([]byte, error) { return nil, task.WaitSignal("approval", 0) }},
		{Name: "act", Run: func(context.Context, []byte) ([]byte, error) {
			if fails > 0 {
				fails--
				return nil, errors.New("flaky")
			}
			return []byte(`"ok"`), nil
		}},
	}
	r := newRunner(t, ns, "a", 5*time.Second, nil)
	run := func() (task.Result, error) {
		ctx, span := tp.Tracer("test").Start(context.Background(), "attempt")
		defer span.End()
		return r.Run(ctx, "sig", steps)
	}
	if res, err := run(); err != nil || res.Waiting == nil {
		t.Fatalf("first run: %+v, %v: want a wait", res, err)
	}
	putSignal(t, cli, ns, "sig", "approval", "k1", `true`)
	if _, err := run(); err == nil {
		t.Fatal("second run: no error, want the step's")
	}
	if res, err := run(); err != nil || res.StepsRun != 1 {
		t.Fatalf("third run: %+v, %v: want step 2 run", res, err)
	}
	var waits, acts []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "await signal":
			waits = append(waits, s)
		case "step act":
			acts = append(acts, s)
		}
	}
	if len(waits) != 1 || len(acts) != 2 {
		t.Fatalf("%d await signal spans and %d step act spans: want 1 and 2", len(waits), len(acts))
	}
	if waits[0].EndTime().After(acts[1].StartTime()) {
		t.Errorf("the wait ends at %v, after its step started at %v", waits[0].EndTime(), acts[1].StartTime())
	}
}

// spanAttr is span s's attribute k as a string ("" when absent).
func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

// Each Run of a named task is a "process agent-tasks" span, a child of
// the traceparent kept with the task and linked to it: the first run's
// caller keeps its own; a later run, under another caller's span, still
// continues the kept one; a traceparent a client's claim kept before any
// Go run (the HTTP API's key) is the parent too. The steps' spans are
// children of their run's span.
func TestRunIsChildOfKeptTraceparent(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r, err := task.NewRunner(context.Background(), cli, task.RunnerConfig{Namespace: ns, WorkerID: "w1", TTL: 5 * time.Second, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	steps := []task.Step{
		{Name: "ask", Run: func(context.Context, []byte) ([]byte, error) { return nil, task.WaitSignal("go", 0) }},
		{Name: "act", Run: func(context.Context, []byte) ([]byte, error) { return []byte(`1`), nil }},
	}
	run := func(id, caller string) (task.Result, string) {
		ctx, span := tp.Tracer("test").Start(context.Background(), caller)
		defer span.End()
		res, err := r.Run(ctx, id, steps)
		if err != nil {
			t.Fatalf("%s: run: %v", id, err)
		}
		return res, otelspan.Format(span.SpanContext())
	}
	res, first := run("kept", "first caller")
	if res.Waiting == nil {
		t.Fatalf("first run: %+v: want a wait", res)
	}
	putSignal(t, cli, ns, "kept", "go", "k1", `true`)
	if res, second := run("kept", "second caller"); res.StepsRun != 1 || second == first {
		t.Fatalf("second run: %+v: want step 2 run, under another caller", res)
	}
	const client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := cli.Put(context.Background(), keyspace.MustNew(ns).TaskTrace("claimed"), client); err != nil {
		t.Fatal(err)
	}
	run("claimed", "third caller")

	want := map[string][]string{"kept": {first, first}, "claimed": {client}}
	ends := map[string][]string{"kept": {otelspan.EndWait, otelspan.EndSuccess}, "claimed": {otelspan.EndWait}}
	got := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		if s.Name() == "process agent-tasks" {
			id := spanAttr(s, "messaging.message.id")
			got[id] = append(got[id], s)
		}
	}
	for id, parents := range want {
		if len(got[id]) != len(parents) {
			t.Fatalf("%s: %d process spans, want %d", id, len(got[id]), len(parents))
		}
		for i, s := range got[id] {
			if p := otelspan.Format(s.Parent()); p != parents[i] || len(s.Links()) != 1 || otelspan.Format(s.Links()[0].SpanContext) != parents[i] {
				t.Errorf("%s run %d: parent %s, links %v: want %s as both", id, i+1, p, s.Links(), parents[i])
			}
			if k, e := spanAttr(s, "drover.task.kind"), spanAttr(s, "drover.attempt.end"); k != "agent" || e != ends[id][i] {
				t.Errorf("%s run %d: kind %q, end %q: want agent, %s", id, i+1, k, e, ends[id][i])
			}
		}
	}
	for _, s := range rec.Ended() {
		if s.Name() != "step act" && s.Name() != "step ask" {
			continue
		}
		under := false
		for _, p := range append(got["kept"], got["claimed"]...) {
			under = under || s.Parent().SpanID() == p.SpanContext().SpanID()
		}
		if !under || spanAttr(s, "messaging.destination.name") != otelspan.AgentTasks {
			t.Errorf("%s: parent %v, destination %q: want a run's span, agent-tasks", s.Name(), s.Parent(), spanAttr(s, "messaging.destination.name"))
		}
	}
}

// With tracing off a Run neither reads nor keeps the task's traceparent:
// under a caller's span context, a Runner whose provider is the global
// one before any is set (nil, or otel.GetTracerProvider() passed as it
// is) or a no-op leaves no traceparent with the task, as one that traces
// does.
func TestRunKeepsNoTraceparentWithTracingOff(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	steps := []task.Step{{Name: "one", Run: func(context.Context, []byte) ([]byte, error) { return []byte(`1`), nil }}}
	for _, tc := range []struct {
		name string
		tp   trace.TracerProvider
		kept bool
	}{{"nil", nil, false}, {"global", otel.GetTracerProvider(), false}, {"noop", noop.NewTracerProvider(), false},
		{"sdk", sdktrace.NewTracerProvider(), true}} {
		r, err := task.NewRunner(context.Background(), cli, task.RunnerConfig{Namespace: ns, WorkerID: "w-" + tc.name, TTL: 5 * time.Second, TracerProvider: tc.tp})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Run(ctx, tc.name, steps)
		_ = r.Close(context.Background())
		if err != nil {
			t.Fatalf("%s: run: %v", tc.name, err)
		}
		got, err := cli.Get(context.Background(), keyspace.MustNew(ns).TaskTrace(tc.name))
		if err != nil {
			t.Fatal(err)
		}
		if kept := len(got.Kvs) == 1 && string(got.Kvs[0].Value) == otelspan.Format(sc); kept != tc.kept {
			t.Errorf("%s: traceparent kept %v (%v), want %v", tc.name, kept, got.Kvs, tc.kept)
		}
	}
}

// KeepTraceParent keeps a task's first traceparent under its claim's
// fence: a runner whose claim was taken over keeps nothing (an error
// matching lease.ErrFenced), the holder keeps its own, and a later
// traceparent does not replace the kept one.
func TestKeepTraceParentIsFenced(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	stale, err := locker.AcquireFenced(ctx, keyspace.TaskLock("t"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stale.Release(ctx); err != nil {
		t.Fatal(err)
	}
	held, err := locker.AcquireFenced(ctx, keyspace.TaskLock("t"))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(context.Background())
	const first, later = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if tp, err := store.KeepTraceParent(ctx, stale, "t", later); !errors.Is(err, lease.ErrFenced) || tp != "" {
		t.Fatalf("a stale claim kept %q (%v): want ErrFenced", tp, err)
	}
	if tp, err := store.KeepTraceParent(ctx, held, "t", first); err != nil || tp != first {
		t.Fatalf("the holder kept %q (%v): want %s", tp, err, first)
	}
	if tp, err := store.KeepTraceParent(ctx, held, "t", later); err != nil || tp != first {
		t.Fatalf("a later traceparent: %q (%v): want the kept %s", tp, err, first)
	}
	if got, err := cli.Get(ctx, keyspace.MustNew(ns).TaskTrace("t")); err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != first {
		t.Fatalf("the key holds %v (%v): want %s", got, err, first)
	}
}

// A Run whose step fails ends its span failed, with an error status and
// the step's error; one stopped by its caller's context ends it handed
// back, without an error status. Neither span is left open.
func TestRunSpanEndsOnErrors(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	r, err := task.NewRunner(context.Background(), cli, task.RunnerConfig{Namespace: ns, WorkerID: "w1", TTL: 5 * time.Second, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	boom := errors.New("boom")
	ctx, cancel := context.WithCancel(context.Background())
	stop := false // the step's caller stops the run, rather than the step failing
	steps := []task.Step{{Name: "fail", Run: func(c context.Context, _ []byte) ([]byte, error) {
		if stop {
			cancel()
			<-c.Done()
			return nil, c.Err()
		}
		return nil, boom
	}}}
	if _, err := r.Run(context.Background(), "failed", steps); !errors.Is(err, task.ErrStepFailed) {
		t.Fatalf("run: %v: want a failed step", err)
	}
	stop = true
	if _, err := r.Run(ctx, "stopped", steps); err == nil {
		t.Fatal("a stopped run: want its error")
	}
	want := map[string]codes.Code{"failed": codes.Error, "stopped": codes.Unset}
	ends := map[string]string{"failed": otelspan.EndFailed, "stopped": otelspan.EndHandedBack}
	for _, s := range rec.Ended() {
		id := spanAttr(s, "messaging.message.id")
		if s.Name() != "process agent-tasks" || id == "" {
			continue
		}
		if e := spanAttr(s, "drover.attempt.end"); e != ends[id] || s.Status().Code != want[id] || len(s.Events()) != 1 {
			t.Errorf("%s: end %q, status %v, events %v: want %s, %v, the error", id, e, s.Status(), s.Events(), ends[id], want[id])
		}
		delete(want, id)
	}
	if len(want) != 0 {
		t.Errorf("runs with no ended span: %v", want)
	}
}
