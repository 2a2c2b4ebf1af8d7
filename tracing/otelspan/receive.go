package otelspan

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// MaxReceiveLinks bounds the links of a claim's span: the creation
// contexts of the first tasks it claimed that were sampled.
const MaxReceiveLinks = 128

// The attributes of a claim's span besides the messaging ones.
const (
	// AttrClaimAsked is how many tasks the claim asked for (the worker's
	// free slots); messaging.batch.message_count is how many it got.
	AttrClaimAsked = attribute.Key("drover.claim.asked")
	// AttrClaimLinked is how many of the tasks' creation contexts it
	// links to: the sampled ones, at most MaxReceiveLinks.
	AttrClaimLinked = attribute.Key("drover.claim.linked")
)

// clientKind is the option of a span of kind client, made once.
var clientKind = trace.WithSpanKind(trace.SpanKindClient)

// On reports whether c's spans may record (On of its tracer): a worker
// asks before gathering what a claim's span needs, so that a claim costs
// nothing more while tracing is off.
func (c *Consumer) On() bool { return On(c.tr) }

// Receive records one claim call of c's worker, from began to now, that
// asked for asked tasks and got got of them, or failed with err:
// "receive <queue>", of kind client, as the messaging conventions make a
// batch receive (messaging.operation.type=receive,
// messaging.batch.message_count). Its parent is base's span, if any; a
// worker passes a context without one (its lease's), so that each claim
// starts a trace, sampled by its own trace id. When it records, it links to the creation contexts that
// traceparent(i), for i from 0 to got-1, gives, only those sampled and at
// most MaxReceiveLinks of them: a link to a context sampled out would
// point at spans no backend has. The sampler decides before the links are
// added, on the span's parent, name and kind, as for attempts.
func (c *Consumer) Receive(base context.Context, began time.Time, asked, got int, traceparent func(i int) string, err error) {
	if !On(c.tr) {
		return
	}
	_, span := c.tr.Start(base, c.rcvName, clientKind, trace.WithTimestamp(began))
	if !span.IsRecording() {
		span.End()
		return
	}
	linked := 0
	for i := 0; i < got && linked < MaxReceiveLinks; i++ {
		if sc, ok := Parse(traceparent(i)); ok && sc.IsSampled() {
			span.AddLink(trace.Link{SpanContext: sc})
			linked++
		}
	}
	span.SetAttributes(c.system, c.dest, c.ns, c.client, c.group,
		semconv.MessagingOperationTypeReceive, semconv.MessagingOperationName("receive"),
		semconv.MessagingBatchMessageCount(got), AttrClaimAsked.Int(asked), AttrClaimLinked.Int(linked))
	if err != nil {
		text := ErrorText(err)
		recordError(span, err, text)
		span.SetStatus(codes.Error, text)
	}
	span.End()
}
