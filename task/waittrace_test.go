package task_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/task"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
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
