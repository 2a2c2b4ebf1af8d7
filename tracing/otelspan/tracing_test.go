package otelspan

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

func TestTraceParentRoundTrips(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	sc, ok := Parse(tp)
	if !ok || !sc.IsRemote() || !sc.IsSampled() {
		t.Fatalf("Parse(%q) = %v, %v", tp, sc, ok)
	}
	if got := Format(sc); got != tp {
		t.Fatalf("Format = %q, want %q", got, tp)
	}
	if got := TraceParent(trace.ContextWithSpanContext(context.Background(), sc)); got != tp {
		t.Fatalf("TraceParent = %q, want %q", got, tp)
	}
	if got := TraceParent(context.Background()); got != "" {
		t.Fatalf("TraceParent of no span = %q, want empty", got)
	}
}

func TestParseRefusesWhatW3CRefuses(t *testing.T) {
	for _, tc := range []struct{ name, s string }{
		{"empty", ""},
		{"short", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0"},
		{"version", "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"upper case", "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"},
		{"zero trace id", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"},
		{"zero span id", "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01"},
		{"separator", "00-4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7-01"},
		{"not hex", "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if sc, ok := Parse(tc.s); ok {
				t.Fatalf("Parse(%q) = %v, want refused", tc.s, sc)
			}
			if ctx := Remote(context.Background(), tc.s); trace.SpanContextFromContext(ctx).IsValid() {
				t.Fatalf("Remote(%q) carries a span context", tc.s)
			}
		})
	}
}

func TestEnvHandsTheSpanContextOn(t *testing.T) {
	sc, _ := Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ts, err := trace.ParseTraceState("vendor=x")
	if err != nil {
		t.Fatal(err)
	}
	ctx := trace.ContextWithSpanContext(context.Background(), sc.WithTraceState(ts))
	got := Env(ctx)
	if len(got) != 2 || got[0] != "TRACEPARENT=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" || got[1] != "TRACESTATE=vendor=x" {
		t.Fatalf("Env = %q", got)
	}
	if got := Env(context.Background()); got != nil {
		t.Fatalf("Env of no span = %q, want nil", got)
	}
}

// TestGlobalTracerTurnsOnWhenAProviderIsSet: the global tracer records
// nothing (and costs nothing: On is false) until a provider is set, then
// delegates to it; the no-op tracer is off, any other on.
func TestGlobalTracerTurnsOnWhenAProviderIsSet(t *testing.T) {
	tr := Tracer(nil)
	if On(tr) || On(noop.NewTracerProvider().Tracer("x")) {
		t.Fatal("On before any provider is set, or for the no-op one")
	}
	sc, _ := Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ctx, span := StartProcess(context.Background(), tr, Format(sc), "process jobs", time.Now())
	if span.IsRecording() || TraceParent(ctx) != Format(sc) {
		t.Fatalf("off: recording %v, context %q: want the creation context passed on", span.IsRecording(), TraceParent(ctx))
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prev := otel.GetTracerProvider()
	otel.SetTracerProvider(tp)
	defer otel.SetTracerProvider(prev)
	if !On(tr) || !On(tp.Tracer("x")) {
		t.Fatal("the global tracer is off once a provider is set")
	}
	_, span = StartProcess(context.Background(), tr, Format(sc), "process jobs", time.Now())
	EndProcess(span, EndSuccess, nil)
	if ended := rec.Ended(); len(ended) != 1 || ended[0].Parent().SpanID() != sc.SpanID() {
		t.Fatalf("spans %v: want one under the creation context", ended)
	}
}

// spanError is an error with a shorter text for spans.
type spanError struct{}

func (spanError) Error() string    { return "cmd: exit status 1: password=hunter2" }
func (spanError) SpanText() string { return "cmd: exit status 1" }

// TestSpansCarryShortErrorTexts: an attempt's status and exception event
// hold the error's SpanText, not its stderr tail, and no error text over
// MaxErrorText bytes; a wait span's reason is cut too, and a wait span
// says no messaging.operation.type (it processes nothing).
func TestSpansCarryShortErrorTexts(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := Tracer(tp)
	long := strings.Repeat("é", 300) // 600 bytes, runes of two
	for _, err := range []error{fmt.Errorf("retry: %w", spanError{}), errors.New(long)} {
		_, span := tr.Start(context.Background(), "process q")
		EndProcess(span, EndRetry, err)
	}
	now := time.Now()
	ctx, span := tr.Start(context.Background(), "process q")
	Describe(ctx, tr, span, Attempt{Queue: "q", Number: 2, Ready: now.Add(-time.Second), Claimed: now,
		WaitAfter: "PENDING", WaitReason: long})
	span.End()
	ended := rec.Ended()
	if len(ended) != 4 {
		t.Fatalf("%d spans, want 4", len(ended))
	}
	if got := ended[0].Status().Description; got != "cmd: exit status 1" {
		t.Fatalf("status %q, want the error without its stderr tail", got)
	}
	for _, s := range ended[:2] {
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), "hunter2") || len(kv.Value.String()) > MaxErrorText {
					t.Fatalf("event %s carries %s=%q", ev.Name, kv.Key, kv.Value.String())
				}
			}
		}
	}
	if got := ended[1].Status().Description; len(got) > MaxErrorText || !utf8.ValidString(got) || !strings.HasSuffix(got, "...") {
		t.Fatalf("status of %d bytes %q: want at most %d, valid UTF-8, cut", len(got), got, MaxErrorText)
	}
	wait := ended[2]
	if wait.Name() != "wait q" {
		t.Fatalf("span %q, want the wait", wait.Name())
	}
	for _, kv := range wait.Attributes() {
		if kv.Key == semconv.MessagingOperationTypeKey {
			t.Fatalf("the wait span says %s=%s", kv.Key, kv.Value.String())
		}
		if kv.Key == AttrWaitReason && len(kv.Value.AsString()) > MaxErrorText {
			t.Fatalf("wait reason of %d bytes", len(kv.Value.AsString()))
		}
	}
	var op bool
	for _, kv := range ended[3].Attributes() {
		op = op || kv.Key == semconv.MessagingOperationTypeKey && kv.Value.AsString() == "process"
	}
	if !op {
		t.Fatal("the attempt span lost messaging.operation.type=process")
	}
}

// maxSampledOutAllocs bounds the allocations of an attempt the sampler
// drops: its creation context (2), the SDK's non-recording span and its
// context (2), and its start time as an option (1). The link, the
// options' array and the attributes are left to an attempt that records.
const maxSampledOutAllocs = 5

// TestSampledOutAttemptAllocates: an attempt whose span the sampler drops
// allocates at most maxSampledOutAllocs times (counted, not timed), and
// one that records still links to its creation context.
func TestSampledOutAttemptAllocates(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	now := time.Now()
	never := sdktrace.TraceIDRatioBased(0)
	out := NewConsumer(Tracer(sdktrace.NewTracerProvider(sdktrace.WithSampler(
		sdktrace.ParentBased(never, sdktrace.WithRemoteParentSampled(never))))), "ns", "jobs", "w")
	n := testing.AllocsPerRun(200, func() {
		_, _, span := out.Start(context.Background(), tp, now)
		if span.IsRecording() {
			t.Fatal("the sampler dropped nothing")
		}
		EndProcess(span, EndSuccess, nil)
	})
	if n > maxSampledOutAllocs {
		t.Errorf("a sampled-out attempt allocates %v times, want at most %d", n, maxSampledOutAllocs)
	}

	rec := tracetest.NewSpanRecorder()
	in := NewConsumer(Tracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), "ns", "jobs", "w")
	_, _, span := in.Start(context.Background(), tp, now)
	EndProcess(span, EndSuccess, nil)
	ended := rec.Ended()
	if len(ended) != 1 || len(ended[0].Links()) != 1 || Format(ended[0].Links()[0].SpanContext) != tp ||
		Format(ended[0].Parent()) != tp || !ended[0].StartTime().Equal(now) {
		t.Fatalf("recorded %v: want one span under and linked to %s, from the claim", ended, tp)
	}
}

// TestErrorEventsCarryOneExceptionType: the exception event of a failed
// submission, attempt and agent run holds exactly one exception.type,
// the type of drover's error, beside its short exception.message, and
// the span's status is an error.
func TestErrorEventsCarryOneExceptionType(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := Tracer(tp)
	err := spanError{}
	_, span := tr.Start(context.Background(), "send q")
	EndSend(span, 0, 0, 1, err)
	_, span = tr.Start(context.Background(), "process q")
	EndProcess(span, EndDead, err)
	_, span = tr.Start(context.Background(), "process agent")
	EndAgent(span, -1, EndFailed, err)
	ended := rec.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	want := fmt.Sprintf("%T", err)
	for _, s := range ended {
		if s.Status().Code != codes.Error || s.Status().Description != "cmd: exit status 1" {
			t.Fatalf("%s: status %v %q", s.Name(), s.Status().Code, s.Status().Description)
		}
		events := s.Events()
		if len(events) != 1 || events[0].Name != semconv.ExceptionEventName {
			t.Fatalf("%s: events %v, want one exception", s.Name(), events)
		}
		var types, messages []string
		for _, kv := range events[0].Attributes {
			switch kv.Key {
			case semconv.ExceptionTypeKey:
				types = append(types, kv.Value.AsString())
			case semconv.ExceptionMessageKey:
				messages = append(messages, kv.Value.AsString())
			}
		}
		if len(types) != 1 || types[0] != want {
			t.Fatalf("%s: exception.type %q, want exactly [%q]", s.Name(), types, want)
		}
		if len(messages) != 1 || messages[0] != "cmd: exit status 1" {
			t.Fatalf("%s: exception.message %q, want the short text once", s.Name(), messages)
		}
	}
}
