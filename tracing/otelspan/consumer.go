package otelspan

import (
	"context"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// Consumer makes the spans of the attempts of one worker of one queue.
// It holds what they share, made once per worker: the tracer, the span
// names and the attributes that do not change from one attempt to the
// next, so that an attempt pays only for what is its own.
type Consumer struct {
	tr                        trace.Tracer
	name, waitName, rcvName   string
	system, dest, ns          attribute.KeyValue
	client, group, op, opName attribute.KeyValue
	kind                      trace.SpanStartOption
	shape                     WaitShape
	parentDecides             bool // ParentBased marked tr's provider
}

// WaitShape is how a Consumer records an attempt's queue wait.
type WaitShape int

// The shapes of the queue wait. WaitSpan is the default; the others
// are experiments whose cost docs/BENCHMARKS.md measures, not (yet) what
// a worker makes.
const (
	// WaitSpan: a "wait <queue>" span with the task's names
	// (messaging.system, the queue, the namespace, the task's id, type
	// and tenant) and the wait's own attributes.
	WaitSpan WaitShape = iota
	// WaitSpanLean: a "wait <queue>" span with only the attributes its
	// parent (the send span) and its sibling (the attempt's span) do not
	// already say: the task's id and the wait's own.
	WaitSpanLean
	// WaitFolded: a first attempt's plain wait (no deferral, no retry,
	// nothing taken over) is no span but drover.wait.start on the
	// attempt's span and a "queued" event at that time; other waits are
	// spans as with WaitSpan.
	WaitFolded
)

// SetWaitShape sets how c records queue waits, before its first
// attempt.
func (c *Consumer) SetWaitShape(s WaitShape) { c.shape = s }

// NewConsumer is the Consumer of worker's attempts of queue q of
// namespace ns, whose spans tr makes.
func NewConsumer(tr trace.Tracer, ns, q, worker string) *Consumer {
	return &Consumer{tr: tr, name: ProcessName(q), waitName: "wait " + q, rcvName: "receive " + q,
		system: semconv.MessagingSystemKey.String(System), dest: semconv.MessagingDestinationName(q),
		ns: AttrNamespace.String(ns), client: semconv.MessagingClientID(worker),
		group: semconv.MessagingConsumerGroupName(q), op: semconv.MessagingOperationTypeProcess,
		opName: semconv.MessagingOperationName("process"), kind: consumerKind, parentDecides: parentDecides(tr)}
}

// consumerKind is the option of a span of kind consumer, made once (the
// API makes a closure each time).
var consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)

// Tracer is the tracer of c's spans.
func (c *Consumer) Tracer() trace.Tracer { return c.tr }

// Start starts the span of one attempt, claimed at claimed, of a task
// whose creation context is traceparent: "process <queue>", of kind
// consumer, a child of the creation context that also links to it (when
// it is valid), so that the submission and every attempt of the task
// form one trace and a viewer that follows links finds the submission
// from the attempt. parent is base with the creation context as its
// remote parent: Describe starts the attempt's wait span under it. The
// traceparent is read once, here.
//
// The sampler decides on the span's parent, name and kind alone: the
// link is added once the span records, so that an attempt the sampler
// drops builds no link, and its options come from a pool. A sampler
// that looks at a span's links at its start sees none here.
func (c *Consumer) Start(base context.Context, traceparent string, claimed time.Time) (ctx, parent context.Context, span trace.Span) {
	sc, ok := Parse(traceparent)
	parent = base
	if ok {
		parent = trace.ContextWithRemoteSpanContext(base, sc)
	}
	if !On(c.tr) || ok && !sc.IsSampled() && c.parentDecides {
		// The creation context still reaches the handler (TRACEPARENT).
		// A parent-based sampler drops a span under one not sampled.
		return parent, parent, noSpan
	}
	opts := startOpts.Get().(*[2]trace.SpanStartOption)
	opts[0], opts[1] = c.kind, trace.WithTimestamp(claimed)
	ctx, span = c.tr.Start(parent, c.name, opts[:]...)
	*opts = [2]trace.SpanStartOption{}
	startOpts.Put(opts)
	if ok && span.IsRecording() {
		span.AddLink(trace.Link{SpanContext: sc})
	}
	return ctx, parent, span
}

// startOpts holds the backing arrays of the options of attempt spans'
// starts: a span's options escape to the tracer, and an array from the
// pool spares each attempt their allocation.
var startOpts = sync.Pool{New: func() any { return new([2]trace.SpanStartOption) }}

// maxAttemptAttrs bounds the attributes attemptCtx holds: an attempt
// span's thirteen and a wait span's ten.
const maxAttemptAttrs = 23

// attemptCtx is an attempt's context: its span's context with the
// attempt's names for the spans inside it (attemptKey), and the backing
// array of the attributes of its spans, all in one allocation.
type attemptCtx struct {
	context.Context
	in    inAttempt
	attrs [maxAttemptAttrs]attribute.KeyValue
}

// Value is the attempt's names for attemptKey, else ctx's value.
func (a *attemptCtx) Value(key any) any {
	if _, ok := key.(attemptKey); ok {
		return &a.in
	}
	return a.Context.Value(key)
}

// Describe sets the attributes of a recording attempt span (ctx's, as
// Start returned it with parent) and records, as children of parent,
// the queue wait before it ("wait <queue>", from Ready to Claimed) and
// the attempts it took over ("process <queue>" with
// drover.attempt.end=lost, reconstructed: they span the time from Ready
// to Claimed, within which the lost attempt ran; the lost worker's own
// span never ended, so it never left its process). It returns ctx
// carrying the attempt's names for the spans started inside it (steps,
// locks, ...). a's Namespace, Queue, Worker and TraceParent are c's and
// Start's: Describe does not read them.
func (c *Consumer) Describe(ctx, parent context.Context, span trace.Span, a *Attempt) context.Context {
	ac := &attemptCtx{Context: ctx}
	attrs := append(ac.attrs[:0], c.system, c.dest, c.ns, semconv.MessagingMessageID(a.TaskID), AttrTaskType.String(a.TaskType))
	if a.Tenant != "" {
		attrs = append(attrs, AttrTenant.String(a.Tenant))
	}
	named := len(attrs) // the task's names: the wait span's and the lost attempts' first attributes
	attrs = append(attrs, c.client, c.group)
	ac.in = inAttempt{tr: c.tr, common: attrs[:len(attrs):len(attrs)]}
	attrs = append(attrs, c.op, c.opName, AttrAttempt.Int(a.Number), AttrTakeover.Bool(len(a.Lost) > 0))
	folded := c.shape == WaitFolded && a.Number == 1 && a.WaitAfter == "" && a.Deferrals == 0 && len(a.Lost) == 0 &&
		!a.Ready.IsZero() && a.Ready.Before(a.Claimed)
	if folded {
		attrs = append(attrs, AttrWaitStart.Int64(a.Ready.UnixNano()))
	}
	if len(attrs) == 12 {
		// The SDK sizes a span's attributes to the first ones set: twelve
		// fill their backing array, and EndProcess's one more would copy
		// them all to one twice as large. Thirteen leave room for it: the
		// end, set here for now, which EndProcess's replaces (the last
		// value of a key is the one a span keeps).
		attrs = append(attrs, AttrAttemptEnd.String(EndCancelled))
	}
	span.SetAttributes(attrs...)
	if folded {
		span.AddEvent("queued", trace.WithTimestamp(a.Ready))
	} else if !a.Ready.IsZero() && a.Ready.Before(a.Claimed) {
		// A wait processes nothing: no messaging.operation.type.
		wait := append(ac.attrs[len(attrs):len(attrs)], ac.attrs[:named]...)
		if c.shape == WaitSpanLean { // the send span's names, and the attempt's
			wait = append(ac.attrs[len(attrs):len(attrs)], ac.attrs[3])
		}
		wait = append(wait, AttrAttempt.Int(a.Number), AttrDeferrals.Int(a.Deferrals))
		if a.WaitAfter != "" {
			wait = append(wait, AttrWaitAfter.String(a.WaitAfter))
		}
		if a.WaitReason != "" {
			wait = append(wait, AttrWaitReason.String(Truncate(a.WaitReason)))
		}
		_, w := c.tr.Start(parent, c.waitName, trace.WithTimestamp(a.Ready))
		w.SetAttributes(wait...)
		w.End(trace.WithTimestamp(a.Claimed))
	}
	for _, n := range a.Lost {
		_, l := c.tr.Start(parent, c.name, c.kind, trace.WithTimestamp(a.Ready), trace.WithAttributes(ac.attrs[:named]...))
		l.SetAttributes(c.op, AttrAttempt.Int(n), AttrAttemptEnd.String(EndLost), AttrReconstructed.Bool(true))
		l.SetStatus(codes.Error, "lost: its worker ended without recording an outcome")
		l.End(trace.WithTimestamp(a.Claimed))
	}
	return ac
}
