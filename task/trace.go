package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

// unsetGlobal is the global provider before one is set, a no-op that
// delegates to the one set later.
var unsetGlobal = otel.GetTracerProvider()

// runnerTracer is the tracer of a Runner's spans from tp. The global
// provider passed as tp (otel.GetTracerProvider() before one is set) is
// taken as nil is, so that tracing counts as off, and a Run reads
// nothing from etcd, until a provider is set.
func runnerTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == unsetGlobal {
		tp = nil
	}
	return otelspan.Tracer(tp)
}

// startRun starts the attempt span of a Run of task id, claimed under f
// at claimed (package otelspan, StartAgent): a child of the traceparent
// kept with the task, and linked to it, so that every run of the task,
// from any process or language, is one trace. The first run that has a
// span context (ctx's) keeps it with the task. With tracing off it reads
// and writes nothing. A traceparent that cannot be read or kept is
// logged: the run goes on, under ctx's span context.
func (r *Runner) startRun(ctx context.Context, f lease.Fence, id string, claimed time.Time) (context.Context, trace.Span) {
	own := otelspan.TraceParent(ctx)
	if !otelspan.On(r.tracer) {
		return otelspan.StartAgent(ctx, r.tracer, "", id, r.worker, "", claimed)
	}
	tp, err := r.store.KeepTraceParent(ctx, f, id, own)
	if err != nil {
		r.logger.Warn("task: its traceparent was not read or kept", "task", id, "err", err)
		tp = own
	}
	return otelspan.StartAgent(ctx, r.tracer, r.store.keys.Namespace(), id, r.worker, tp, claimed)
}

// endRun ends a Run's attempt span with how the run ended: res and err,
// and stopped, the cause of the end of the run's context if it ended
// while the steps ran. A step's error after its context ended (most
// often that context's own error) is the run stopped, not the step
// failed: its claim was lost, or its caller stopped it.
func endRun(span trace.Span, res Result, err, stopped error) {
	if !span.IsRecording() {
		span.End()
		return
	}
	lost := func(e error) bool {
		return errors.Is(e, lock.ErrFenced) || errors.Is(e, lock.ErrLost) || errors.Is(e, lease.ErrLost)
	}
	end := otelspan.EndSuccess
	switch {
	case err != nil && stopped != nil && lost(stopped):
		end = otelspan.EndLost
	case err != nil && stopped != nil:
		end = otelspan.EndHandedBack
	case errors.Is(err, ErrStepFailed):
		end = otelspan.EndFailed
	case lost(err):
		end = otelspan.EndLost
	case err != nil:
		end = otelspan.EndHandedBack
	case !res.SleepingUntil.IsZero():
		end = otelspan.EndSleep
	case res.Waiting != nil:
		end = otelspan.EndWait
	}
	otelspan.EndAgent(span, res.ResumedFrom-1, end, err)
}

// KeepTraceParent is the W3C traceparent kept with task id: the one
// kept, or tp (when valid) kept now if none is, under fence f (a fence
// lost keeps nothing: an error matching lease.ErrFenced); "" when
// neither. The HTTP API's agent task claims keep theirs through it,
// under the same key, which goes with the task's other keys.
func (s *Store) KeepTraceParent(ctx context.Context, f lease.Fence, id, tp string) (string, error) {
	key := s.keys.TaskTrace(id)
	if _, ok := otelspan.Parse(tp); !ok {
		r, err := s.cli.Get(ctx, key)
		if err != nil || len(r.Kvs) == 0 {
			return "", err
		}
		return string(r.Kvs[0].Value), nil
	}
	r, err := f.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, tp)).Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return "", fmt.Errorf("task %s: keep its traceparent: %w", id, err)
	}
	if !r.Succeeded {
		if kvs := r.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			return string(kvs[0].Value), nil
		}
	}
	return tp, nil
}
