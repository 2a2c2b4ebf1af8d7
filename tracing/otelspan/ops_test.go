package otelspan

import (
	"context"
	"errors"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

var (
	errBoom  = errors.New("boom")
	approval = []string{"approve"}
)

// everyOp starts and ends every span of the work inside an attempt, and
// sends a signal with tr.
func everyOp(ctx context.Context, tr trace.Tracer, t0 time.Time) {
	sctx, step := StartStep(ctx, "t1", 2, "draft")
	_, cp := StartCheckpoint(sctx, "t1", 2)
	End(cp, nil)
	lctx, l := StartLock(sctx, "report")
	LockWait(lctx, l, "report", t0, t0.Add(time.Second))
	EndLock(l, true, 42, nil)
	_, sp := StartSpawn(sctx, "t1", 2, 3)
	End(sp, errBoom)
	ChildrenWait(ctx, "t1", 2, 3, 3, t0, t0.Add(time.Minute))
	SignalWait(ctx, "t1", 2, approval, "approve", false, t0, t0.Add(time.Hour))
	_, sg := StartSignal(ctx, tr, "ns", "t1", "approve")
	End(sg, nil)
	End(step, nil)
}

// TestOpsOffAllocateNothing: with tracing off, or inside an attempt whose
// span does not record, the spans inside an attempt allocate nothing.
func TestOpsOffAllocateNothing(t *testing.T) {
	t0 := time.Now()
	sampledOut := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	for name, tr := range map[string]trace.Tracer{"off": Tracer(nil), "sampled out": Tracer(sampledOut)} {
		ctx, attempt := StartProcess(context.Background(), tr, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", "process jobs", t0)
		ctx = WithAttempt(ctx, tr, Attempt{Namespace: "ns", Queue: "jobs", TaskID: "t1"})
		// A signal's sender decides its sampling by itself, as a
		// submission does: sampled out, that costs what StartSend does.
		off := Tracer(nil)
		if n := testing.AllocsPerRun(100, func() { everyOp(ctx, off, t0) }); n != 0 {
			t.Errorf("%s: %v allocations a run, want 0", name, n)
		}
		attempt.End()
	}
}

// BenchmarkOpsOff is what the spans inside an attempt cost with tracing
// off: a context lookup each.
func BenchmarkOpsOff(b *testing.B) {
	tr, t0 := Tracer(nil), time.Now()
	ctx, _ := StartProcess(context.Background(), tr, "", "process jobs", t0)
	b.ReportAllocs()
	for b.Loop() {
		everyOp(ctx, tr, t0)
	}
}

// TestOpsAreChildrenOfTheAttempt: inside a recording attempt, each span
// is a child of the span it happens in, named as documented, and carries
// the attempt's names of task, queue, namespace, tenant and worker.
func TestOpsAreChildrenOfTheAttempt(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr, t0 := Tracer(tp), time.Now()
	ctx, attempt := StartProcess(context.Background(), tr, "", "process jobs", t0)
	ctx = WithAttempt(ctx, tr, Attempt{Namespace: "ns", Queue: "jobs", TaskID: "t1", TaskType: "x", Tenant: "acme", Worker: "w1"})
	everyOp(ctx, tr, t0)
	attempt.End()
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	for name, parent := range map[string]string{"step draft": "process jobs", "checkpoint": "step draft", "lock acquire": "step draft",
		"lock wait": "lock acquire", "spawn children": "step draft", "await children": "process jobs",
		"await signal": "process jobs", "send signal": "process jobs"} {
		s, ok := spans[name]
		if !ok {
			t.Errorf("no span %q among %d", name, len(spans))
			continue
		}
		if want := spans[parent].SpanContext().SpanID(); s.Parent().SpanID() != want {
			t.Errorf("%s: parent %s, want %s (%s)", name, s.Parent().SpanID(), want, parent)
		}
		if s.SpanContext().TraceID() != attempt.SpanContext().TraceID() {
			t.Errorf("%s: another trace", name)
		}
		attrs := map[attribute.Key]string{}
		for _, kv := range s.Attributes() {
			attrs[kv.Key] = kv.Value.String()
		}
		if name == "send signal" {
			continue // a sender's span: its own attributes
		}
		for k, v := range map[attribute.Key]string{"messaging.system": "drover", "messaging.destination.name": "jobs",
			"messaging.message.id": "t1", "drover.namespace": "ns", "drover.tenant": "acme", "messaging.client.id": "w1"} {
			if attrs[k] != v {
				t.Errorf("%s: %s=%q, want %q", name, k, attrs[k], v)
			}
		}
	}
	if got := spans["lock wait"]; got != nil && got.EndTime().Sub(got.StartTime()) != time.Second {
		t.Errorf("lock wait lasts %v, want 1s", got.EndTime().Sub(got.StartTime()))
	}
	if got := spans["spawn children"]; got != nil && got.Status().Description != "boom" {
		t.Errorf("spawn's status %q, want boom", got.Status().Description)
	}
	if got := spans["send signal"]; got != nil && got.SpanKind() != trace.SpanKindProducer {
		t.Errorf("send signal is of kind %v", got.SpanKind())
	}
}

// TestOpsOutsideAnAttempt: under a caller's own recording span (a
// task.Runner's caller), the spans still come, named by the task id.
func TestOpsOutsideAnAttempt(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, root := tp.Tracer("caller").Start(context.Background(), "caller")
	_, s := StartStep(ctx, "t9", 1, "fetch")
	End(s, nil)
	root.End()
	ended := rec.Ended()
	if len(ended) != 2 || ended[0].Name() != "step fetch" || ended[0].Parent().SpanID() != root.SpanContext().SpanID() {
		t.Fatalf("spans %v", ended)
	}
	found := false
	for _, kv := range ended[0].Attributes() {
		found = found || (kv.Key == "messaging.message.id" && kv.Value.AsString() == "t9")
	}
	if !found {
		t.Errorf("step span without the task id: %v", ended[0].Attributes())
	}
}

// TestConsumerOffAllocatesNothing: with tracing off, a worker's attempt
// of a task without a traceparent costs its span no allocation.
func TestConsumerOffAllocatesNothing(t *testing.T) {
	c := NewConsumer(Tracer(nil), "ns", "jobs", "w")
	t0 := time.Now()
	if n := testing.AllocsPerRun(100, func() {
		_, _, span := c.Start(context.Background(), "", t0)
		EndProcess(span, EndSuccess, nil)
	}); n != 0 {
		t.Fatalf("%v allocations an attempt, want 0", n)
	}
}
