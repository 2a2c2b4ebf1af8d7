package otelspan

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// TestParentBasedSkipsUnsampled: with a provider marked ParentBased, an
// attempt under a creation context not sampled starts no span (its
// context is the creation context, for TRACEPARENT) and allocates what
// tracing off does for a task that carries one; one under a sampled
// context records as before. Unmarked, the SDK decides.
func TestParentBasedSkipsUnsampled(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	sdk := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	out := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	in := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	now := time.Now()
	c := NewConsumer(Tracer(ParentBased(sdk)), "ns", "jobs", "w1")
	ctx, _, span := c.Start(context.Background(), out, now)
	if span.IsRecording() || TraceParent(ctx) != out {
		t.Errorf("not sampled: recording %t, traceparent %q", span.IsRecording(), TraceParent(ctx))
	}
	off := NewConsumer(Tracer(nil), "ns", "jobs", "w1")
	want := testing.AllocsPerRun(100, func() { _, _, _ = off.Start(context.Background(), out, now) })
	if n := testing.AllocsPerRun(100, func() { _, _, _ = c.Start(context.Background(), out, now) }); n != want {
		t.Errorf("%v allocations, want %v (tracing off's)", n, want)
	}
	_, _, span = c.Start(context.Background(), in, now)
	if !span.IsRecording() {
		t.Error("sampled: not recording")
	}
	span.End()
	// Unmarked, an SDK that samples everything records it.
	_, _, span = NewConsumer(Tracer(sdk), "ns", "jobs", "w1").Start(context.Background(), out, now)
	if span.IsRecording() {
		t.Error("unmarked, parent-based default: recording a span under a parent not sampled")
	}
	always := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	if _, _, span = NewConsumer(Tracer(always), "ns", "jobs", "w1").Start(context.Background(), out, now); !span.IsRecording() {
		t.Error("unmarked, always on: not recording")
	}
	if ParentBased(ParentBased(sdk)) != ParentBased(sdk) {
		t.Error("marked twice")
	}
	var _ trace.TracerProvider = ParentBased(sdk)
}

// TestParentBasedNoopIsOff: a no-op provider marked ParentBased (a
// library user's provider while their tracing is off) is off still: a
// claim and an attempt cost what they cost unmarked.
func TestParentBasedNoopIsOff(t *testing.T) {
	c := NewConsumer(Tracer(ParentBased(noop.NewTracerProvider())), "ns", "jobs", "w1")
	if c.On() {
		t.Error("a marked no-op provider is on")
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	now := time.Now()
	if n := testing.AllocsPerRun(100, func() { c.Receive(context.Background(), now, 4, 4, func(int) string { return tp }, nil) }); n != 0 {
		t.Errorf("%v allocations a claim, want 0", n)
	}
	if n := testing.AllocsPerRun(100, func() { _, _, _ = c.Start(context.Background(), "", now) }); n != 0 {
		t.Errorf("%v allocations an untraced task's attempt, want 0", n)
	}
}
