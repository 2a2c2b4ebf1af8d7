package otelspan

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// AgentTasks is the destination an agent task's attempt spans name:
// agent tasks (named tasks a Runner or a client's step API runs) are
// claimed by id, from no queue.
const AgentTasks = "agent-tasks"

// The attributes of an agent task's attempt span beyond an attempt's.
const (
	AttrTaskKind     = attribute.Key("drover.task.kind")
	AttrResumedAfter = attribute.Key("drover.step.resumed_after")
)

// The ends of an agent task's attempt beyond a queue attempt's: a step
// failed (the run stopped with its error).
const EndFailed = "failed"

// agentName is the name of an agent task's attempt spans.
var agentName = ProcessName(AgentTasks)

// StartAgent starts the span of one run of agent task id of namespace
// ns by worker, claimed at claimed: "process agent-tasks", of kind
// consumer, a child of the task's kept creation context traceparent and
// linked to it (as a queue task's attempt is, and as the TypeScript and
// Python clients' runs are), with drover.task.kind=agent. The spans
// started inside it (steps, checkpoints, spawns, waits) carry its task's
// names. End it with EndAgent.
func StartAgent(ctx context.Context, tr trace.Tracer, ns, id, worker, traceparent string, claimed time.Time) (context.Context, trace.Span) {
	c := Consumer{tr: tr, name: agentName, kind: consumerKind}
	ctx, _, span := c.Start(ctx, traceparent, claimed)
	if !span.IsRecording() {
		return ctx, span
	}
	common := []attribute.KeyValue{semconv.MessagingSystemKey.String(System), semconv.MessagingDestinationName(AgentTasks),
		AttrNamespace.String(ns), semconv.MessagingMessageID(id), semconv.MessagingClientID(worker)}
	span.SetAttributes(common...)
	span.SetAttributes(semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"), AttrTaskKind.String("agent"))
	return context.WithValue(ctx, attemptKey{}, &inAttempt{tr: tr, common: common}), span
}

// EndAgent ends an agent task's attempt span with the last step
// checkpointed before the run (resumedAfter; negative when the run did
// not get as far as reading it), how the run ended (one of the End
// constants, EndFailed too) and its error; failed and lost runs are
// errors.
func EndAgent(span trace.Span, resumedAfter int, end string, err error) {
	if span.IsRecording() {
		if resumedAfter >= 0 {
			span.SetAttributes(AttrResumedAfter.Int(resumedAfter))
		}
		span.SetAttributes(AttrAttemptEnd.String(end))
		if err != nil && end != EndSuccess {
			text := ErrorText(err)
			recordError(span, err, text)
			if end == EndFailed || end == EndLost {
				span.SetStatus(codes.Error, text)
			}
		}
	}
	span.End()
}
