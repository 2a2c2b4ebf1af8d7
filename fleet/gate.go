package fleet

import (
	"context"
	"errors"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/queue"
)

// Gate adapts flow control gate g to a queue worker: each task is admitted
// as the call CallOf(t), a deferral (drover.DeferError, which both
// packages name) is returned unwrapped (the task goes back to its queue,
// uncharged, for its delay), and g's done hears the handler's error read by TaskOutcome.
// Any other error of g (ctx's, etcd's) is returned as it is.
func Gate(g flow.Gate) queue.Gate { return gate{g} }

// Gates adapts each of gs with Gate, in order.
func Gates(gs []flow.Gate) []queue.Gate {
	out := make([]queue.Gate, len(gs))
	for i, g := range gs {
		out[i] = Gate(g)
	}
	return out
}

type gate struct{ g flow.Gate }

func (a gate) Admit(ctx context.Context, t *queue.Task) (func(error), error) {
	done, err := a.g.Admit(ctx, CallOf(t))
	if err != nil {
		var de *flow.DeferError // the queue's DeferError too
		if errors.As(err, &de) {
			return nil, de
		}
		return nil, err
	}
	if done == nil {
		return ignore, nil
	}
	return done, nil
}

// ignore is the done of a gate that does not apply to a task.
func ignore(error) {}

// CallOf returns what flow control reads of task t: its id, type and
// tenant, with its handler's errors read by TaskOutcome.
func CallOf(t *queue.Task) flow.Call {
	return flow.Call{ID: t.ID, Type: t.Type, Tenant: t.Metadata.Tenant, Outcome: TaskOutcome}
}

// TaskOutcome reads the error a queue worker gives a gate's done: nil
// succeeded; queue.ErrNotRun (a later gate refused the task) did not run;
// a permanent failure (the task's own fault), a cancellation, a shutdown
// or a cancelled context say nothing about the resource; any other error
// (a transient failure, a timeout) failed.
func TaskOutcome(err error) flow.Outcome {
	switch {
	case err == nil:
		return flow.Succeeded
	case errors.Is(err, queue.ErrNotRun):
		return flow.NotRun
	case errors.Is(err, queue.ErrPermanent), errors.Is(err, queue.ErrCancelled), errors.Is(err, queue.ErrShutdown),
		errors.Is(err, context.Canceled):
		return flow.Inconclusive
	}
	return flow.Failed
}
