package otelspan

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// The spans of the work inside an attempt: its steps, their checkpoint
// writes, the locks it takes, the children it spawns and waits for, the
// signals it waits for and sends. Each is a child of the span of ctx when
// that one records (an attempt's, a route's, a caller's own), and costs a
// context lookup and no allocation when it does not: tracing off, the
// task sampled out, or no span at all.

// The attributes of the spans inside an attempt.
const (
	AttrStep        = attribute.Key("drover.step.number")
	AttrStepName    = attribute.Key("drover.step.name")
	AttrLockName    = attribute.Key("drover.lock.name")
	AttrLockWaited  = attribute.Key("drover.lock.waited")
	AttrLockToken   = attribute.Key("drover.lock.token")
	AttrChildren    = attribute.Key("drover.children.count")
	AttrChildWait   = attribute.Key("drover.children.wait")
	AttrSignalName  = attribute.Key("drover.signal.name")
	AttrSignalNames = attribute.Key("drover.signal.names")
	AttrTimedOut    = attribute.Key("drover.signal.timed_out")
)

// attemptKey is the context key of an attempt's description.
type attemptKey struct{}

// inAttempt is what the spans inside a recording attempt share: its
// tracer and the attributes that name its task, queue, namespace, tenant
// and worker.
type inAttempt struct {
	tr     trace.Tracer
	common []attribute.KeyValue
}

// WithAttempt returns ctx carrying attempt a's names for the spans
// started inside it; ctx as it is when its span does not record.
func WithAttempt(ctx context.Context, tr trace.Tracer, a Attempt) context.Context {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx
	}
	common := make([]attribute.KeyValue, 0, 9)
	common = append(common, semconv.MessagingSystemKey.String(System), semconv.MessagingDestinationName(a.Queue),
		AttrNamespace.String(a.Namespace), semconv.MessagingMessageID(a.TaskID), AttrTaskType.String(a.TaskType),
		semconv.MessagingClientID(a.Worker), semconv.MessagingConsumerGroupName(a.Queue))
	if a.Tenant != "" {
		common = append(common, AttrTenant.String(a.Tenant))
	}
	return context.WithValue(ctx, attemptKey{}, &inAttempt{tr: tr, common: common})
}

// inner is the tracer and common attributes of a span started inside
// ctx's span, and false when ctx's span does not record.
func inner(ctx context.Context) (trace.Tracer, []attribute.KeyValue, bool) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return nil, nil, false
	}
	if a, ok := ctx.Value(attemptKey{}).(*inAttempt); ok {
		return a.tr, a.common, true
	}
	return parent.TracerProvider().Tracer(Scope), nil, true
}

// startInner starts span name inside ctx's recording span with the
// attempt's attributes and attrs, or returns ctx and a no-op span.
func startInner(ctx context.Context, name string, kind trace.SpanKind, taskID string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	tr, common, ok := inner(ctx)
	if !ok {
		return ctx, noSpan
	}
	ctx, span := tr.Start(ctx, name, trace.WithSpanKind(kind))
	span.SetAttributes(common...)
	if common == nil && taskID != "" {
		span.SetAttributes(semconv.MessagingSystemKey.String(System), semconv.MessagingMessageID(taskID))
	}
	span.SetAttributes(attrs...)
	return ctx, span
}

// StartStep starts the span of step n (from 1), named name, of task id:
// "step <name>". End it with End.
func StartStep(ctx context.Context, id string, n int, name string) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return startInner(ctx, "step "+name, trace.SpanKindInternal, id, AttrStep.Int(n), AttrStepName.String(name))
}

// StartCheckpoint starts the span of the checkpoint write of step n of
// task id: "checkpoint". End it with End.
func StartCheckpoint(ctx context.Context, id string, n int) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return startInner(ctx, "checkpoint", trace.SpanKindInternal, id, AttrStep.Int(n))
}

// StartLock starts the span of the acquisition of lock name: "lock
// acquire". End it with EndLock.
func StartLock(ctx context.Context, name string) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return startInner(ctx, "lock acquire", trace.SpanKindInternal, "", AttrLockName.String(name))
}

// LockWait records, inside a lock's acquisition span, the wait in line
// for it from since to until ("lock wait"); nothing when span does not
// record or nothing was waited for.
func LockWait(ctx context.Context, span trace.Span, name string, since, until time.Time) {
	if !span.IsRecording() || !since.Before(until) {
		return
	}
	tr, common, _ := inner(ctx)
	if tr == nil {
		tr = span.TracerProvider().Tracer(Scope)
	}
	_, w := tr.Start(ctx, "lock wait", trace.WithTimestamp(since), trace.WithAttributes(common...))
	w.SetAttributes(AttrLockName.String(name))
	w.End(trace.WithTimestamp(until))
}

// EndLock ends a lock's acquisition span with whether it waited, the
// fencing token it got (0 when none) and its error.
func EndLock(span trace.Span, waited bool, token int64, err error) {
	if span.IsRecording() {
		span.SetAttributes(AttrLockWaited.Bool(waited))
		if token != 0 {
			span.SetAttributes(AttrLockToken.Int64(token))
		}
	}
	End(span, err)
}

// StartSpawn starts the span of step n of task id spawning children
// children: "spawn children", of kind producer (their send spans are its
// children). End it with End.
func StartSpawn(ctx context.Context, id string, n, children int) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, noSpan
	}
	return startInner(ctx, "spawn children", trace.SpanKindProducer, id, AttrStep.Int(n), AttrChildren.Int(children))
}

// ChildrenWait records the parent's wait for the children of step n of
// task id, from since (its checkpoint) to until (the run that found them
// done): "await children", wait of them counted. The wait spans
// attempts (the parent parks meanwhile), so it is recorded once over.
func ChildrenWait(ctx context.Context, id string, n, children, wait int, since, until time.Time) {
	if !trace.SpanFromContext(ctx).IsRecording() || since.IsZero() || !since.Before(until) {
		return
	}
	record(ctx, "await children", id, since, until, nil, AttrStep.Int(n), AttrChildren.Int(children), AttrChildWait.Int(wait))
}

// SignalWait records the wait of step n of task id for one of names,
// from since to until, ended by signal got (or its timeout): "await
// signal". Like ChildrenWait, recorded once the wait is over.
func SignalWait(ctx context.Context, id string, n int, names []string, got string, timedOut bool, since, until time.Time) {
	if !trace.SpanFromContext(ctx).IsRecording() || since.IsZero() || !since.Before(until) {
		return
	}
	record(ctx, "await signal", id, since, until, nil, AttrStep.Int(n), AttrSignalNames.StringSlice(names),
		AttrSignalName.String(got), AttrTimedOut.Bool(timedOut))
}

// record records a span that is over, from since to until.
func record(ctx context.Context, name, id string, since, until time.Time, err error, attrs ...attribute.KeyValue) {
	tr, common, _ := inner(ctx)
	_, span := tr.Start(ctx, name, trace.WithTimestamp(since), trace.WithAttributes(common...))
	if common == nil {
		span.SetAttributes(semconv.MessagingSystemKey.String(System), semconv.MessagingMessageID(id))
	}
	span.SetAttributes(attrs...)
	if err != nil {
		span.SetStatus(codes.Error, ErrorText(err))
	}
	span.End(trace.WithTimestamp(until))
}

// StartSignal starts the span of sending signal name to task id of
// namespace ns: "send signal", of kind producer, with the signal's name
// as an attribute (names are many; span names stay few). tr is the
// sender's tracer: a signal is sent from outside any attempt (a route, a
// command, another task). End it with End.
func StartSignal(ctx context.Context, tr trace.Tracer, ns, id, name string) (context.Context, trace.Span) {
	if !On(tr) {
		return ctx, noSpan
	}
	ctx, span := tr.Start(ctx, "send signal", trace.WithSpanKind(trace.SpanKindProducer))
	if span.IsRecording() {
		span.SetAttributes(semconv.MessagingSystemKey.String(System), semconv.MessagingOperationTypeSend,
			AttrNamespace.String(ns), semconv.MessagingMessageID(id), AttrSignalName.String(name))
	}
	return ctx, span
}

// End ends span, with err (cut as ErrorText does) as its error status.
func End(span trace.Span, err error) {
	if err != nil && span.IsRecording() {
		text := ErrorText(err)
		span.SetStatus(codes.Error, text)
	}
	span.End()
}
