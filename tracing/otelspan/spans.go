package otelspan

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Scope is the instrumentation scope of drover's spans.
const Scope = "github.com/droverhq/drover"

// Tracer is drover's tracer from tp, or from the global provider when tp
// is nil.
func Tracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		// The global provider delegates to the one set later, if any.
		return globalTracer{otel.GetTracerProvider().Tracer(Scope)}
	}
	return tp.Tracer(Scope)
}

// globalTracer is the global provider's tracer, told apart by On.
type globalTracer struct{ trace.Tracer }

// unset is the global provider before anyone sets one: a no-op.
var unset = otel.GetTracerProvider()

// noSpan is the span of a context without one: a no-op, shared.
var noSpan = trace.SpanFromContext(context.Background())

// On reports whether tr may record spans: false for the global tracer
// while no provider is set and for the no-op one. Callers skip building a
// span's name and options when it is false, which keeps tracing off free.
func On(tr trace.Tracer) bool {
	switch tr.(type) {
	case globalTracer:
		return otel.GetTracerProvider() != unset
	case noop.Tracer:
		return false
	}
	return true
}

// messaging is the attributes every span of queue q carries.
func messaging(ns, q string, op attribute.KeyValue) []attribute.KeyValue {
	return []attribute.KeyValue{semconv.MessagingSystemKey.String(System), semconv.MessagingDestinationName(q), op, AttrNamespace.String(ns)}
}

// StartSend starts the span of a submission of n tasks to queue q of
// namespace ns: "send <q>", of kind producer, a child of ctx's span. The
// context it returns is the creation context the tasks store.
func StartSend(ctx context.Context, tr trace.Tracer, ns, q string, n int) (context.Context, trace.Span) {
	if !On(tr) {
		return ctx, noSpan // the caller's span context, if any, is the creation context
	}
	ctx, span := tr.Start(ctx, "send "+q, trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(messaging(ns, q, semconv.MessagingOperationTypeSend)...)
		span.SetAttributes(semconv.MessagingOperationName("send"))
		if n > 1 {
			span.SetAttributes(semconv.MessagingBatchMessageCount(n))
		}
	}
	return ctx, span
}

// EndSend ends a submission's span with what it did.
func EndSend(span trace.Span, submitted, duplicates, rejected int, err error) {
	if span.IsRecording() {
		span.SetAttributes(AttrSubmitted.Int(submitted), AttrDuplicates.Int(duplicates), AttrRejected.Int(rejected))
		if err != nil {
			text := ErrorText(err)
			recordError(span, err, text)
			span.SetStatus(codes.Error, text)
		}
	}
	span.End()
}

// StartProcess starts the span of one attempt of a task of queue q,
// claimed at claimed: "process <q>", of kind consumer. It is a child of
// the task's creation context traceparent and links to it too (when it
// is valid), so that the submission and every attempt of the task form
// one trace, and a viewer that follows links finds the submission from
// the attempt. Describe it when it records.
//
// name is ProcessName(q), which a worker makes once.
func StartProcess(ctx context.Context, tr trace.Tracer, traceparent, name string, claimed time.Time) (context.Context, trace.Span) {
	c := Consumer{tr: tr, name: name, kind: consumerKind}
	ctx, _, span := c.Start(ctx, traceparent, claimed)
	return ctx, span
}

// ProcessName is the name of the attempt spans of queue q.
func ProcessName(q string) string { return "process " + q }

// Attempt describes one attempt of a task for its spans.
type Attempt struct {
	Namespace, Queue string
	// TraceParent is the task's creation context.
	TraceParent      string
	TaskID, TaskType string
	Tenant           string
	Worker           string
	// Number is the attempt's number, from 1.
	Number int
	// Ready is when the task became claimable for this attempt (its
	// submission, its due time, its last retry or deferral) and Claimed
	// when this attempt claimed it: the queue wait.
	Ready, Claimed time.Time
	// WaitAfter is the status the task waited in (PENDING, RETRYING,
	// SCHEDULED, ...) and WaitReason why, when it was handed back
	// (a deferral's reason) or retried (the error); Deferrals counts the
	// deferrals in a row before this attempt.
	WaitAfter, WaitReason string
	Deferrals             int
	// Lost are the numbers of the attempts before this one whose worker
	// ended without recording an outcome: this attempt took the task over.
	Lost []int
}

// Describe sets a recording attempt span's attributes and records, as
// children of the task's creation context, the queue wait before it and
// the attempts it took over, as Consumer.Describe does. A worker makes a
// Consumer once instead: Describe makes one for each call.
func Describe(ctx context.Context, tr trace.Tracer, span trace.Span, a Attempt) {
	parent := Remote(ctx, a.TraceParent) // without a creation context: under the attempt's span
	NewConsumer(tr, a.Namespace, a.Queue, a.Worker).Describe(ctx, parent, span, &a)
}

// EndProcess ends an attempt's span with how it ended (one of the End
// constants) and, for a failed one, its error.
func EndProcess(span trace.Span, end string, err error) {
	if span.IsRecording() {
		span.SetAttributes(AttrAttemptEnd.String(end))
		if err != nil && end != EndSuccess {
			text := ErrorText(err)
			recordError(span, err, text)
			if end == EndRetry || end == EndDead || end == EndLost {
				span.SetStatus(codes.Error, text)
			}
		}
	}
	span.End()
}

// recordError adds err's exception event: exception.type names err's own
// type and exception.message holds text (its short span text). The SDK's
// RecordError would add a second exception.type, that of the error it is
// handed, so the event is added here instead.
func recordError(span trace.Span, err error, text string) {
	span.AddEvent(semconv.ExceptionEventName, trace.WithAttributes(
		semconv.ExceptionType(fmt.Sprintf("%T", err)), semconv.ExceptionMessage(text)))
}

// Env is the environment that hands ctx's span context to a command:
// TRACEPARENT (and TRACESTATE when there is one), as OpenTelemetry's
// environment carriers name them; nil when ctx holds none.
func Env(ctx context.Context) []string {
	sc := trace.SpanContextFromContext(ctx)
	tp := Format(sc)
	if tp == "" {
		return nil
	}
	env := []string{"TRACEPARENT=" + tp}
	if ts := sc.TraceState().String(); ts != "" {
		env = append(env, "TRACESTATE="+ts)
	}
	return env
}

// MaxErrorText bounds the error text a span carries (its status
// description, its exception event, drover.wait.reason), in bytes.
const MaxErrorText = 256

// Texter is an error that has a shorter text for spans than its Error:
// an exec handler's failure, whose Error ends with the tail of its
// command's standard error, which may hold anything the command printed
// (secrets too) and stays out of traces.
type Texter interface {
	SpanText() string
}

// ErrorText is the text of err that its spans carry: its SpanText when an
// error in its chain has one, else its Error, cut to MaxErrorText bytes.
func ErrorText(err error) string {
	var st Texter
	if errors.As(err, &st) {
		return Truncate(st.SpanText())
	}
	return Truncate(err.Error())
}

// Truncate cuts s to at most MaxErrorText bytes, at a rune boundary, with
// "..." in place of what it cut.
func Truncate(s string) string {
	if len(s) <= MaxErrorText {
		return s
	}
	cut := MaxErrorText - 3
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}
