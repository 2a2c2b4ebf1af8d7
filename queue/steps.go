package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

type claimKey struct{}

// claimFence is a running task's claim as a fence for writes made while
// handling it (see Steps).
type claimFence struct {
	w      *Worker
	c      *claim
	cancel context.CancelCauseFunc // ends the handler's context
	ctx    context.Context         // the claim's: ends with a cancel, the lease, or the attempt
}

var _ lease.Fence = (*claimFence)(nil)

// Txn starts a transaction that commits only while the claim is held.
func (f *claimFence) Txn(ctx context.Context) clientv3.Txn {
	var also []clientv3.Cmp
	if f.c.run != nil { // a task of a run: not cancelled (its slot has no exit)
		also = append(also, clientv3.Compare(clientv3.CreateRevision(f.w.keys.Exit(f.w.cfg.Queue, f.c.run.seg, f.c.slot)), "=", 0))
	}
	return lease.NewFencedTxn(ctx, f.w.cli, lease.Spec{
		Name:  fmt.Sprintf("claim of task %s", f.c.task.ID),
		Token: f.c.token,
		Cmp:   clientv3.Compare(clientv3.CreateRevision(f.c.claimKey), "=", f.c.token),
		Also:  also,
		Check: f.Err,
		Lost:  func(cause error) { f.cancel(fmt.Errorf("%w: claim lost: %w", lock.ErrLost, cause)) },
	})
}

// Token is the claim's fencing token.
func (f *claimFence) Token() int64 { return f.c.token }

// Context is cancelled when the claim ends: the task was cancelled, the
// worker's lease was lost, a write under the claim was refused, or the
// attempt is over.
func (f *claimFence) Context() context.Context { return f.ctx }

// Err reports the worker's lease loss, which ends every claim, and the end
// of the claim's context.
func (f *claimFence) Err() error {
	if err := f.w.lease.Err(); err != nil {
		return err
	}
	if f.ctx.Err() != nil {
		return context.Cause(f.ctx)
	}
	return nil
}

// ClaimFence returns the claim of the task a handler runs, as a lease.Fence:
// writes made with its Txn commit only while the claim is held, and its
// Context ends when the claim does. It is nil outside a handler.
func ClaimFence(ctx context.Context) lease.Fence {
	if f, ok := ctx.Value(claimKey{}).(*claimFence); ok {
		return f
	}
	return nil
}

// Steps returns a handler that runs each task as agent steps, with the task
// runner's checkpoints (see package task): the first step gets the task's
// parameters, every step's checkpoint is written fenced by the task's claim,
// and an attempt that follows one that died (a worker killed, a claim lost)
// resumes after the last checkpointed step instead of starting over. The
// result is the last step's state. A step's error fails the attempt (and is
// retried like any handler error).
func Steps(store *task.Store, steps ...task.Step) Handler {
	return func(ctx context.Context, t *Task) ([]byte, error) {
		f, ok := ctx.Value(claimKey{}).(*claimFence)
		if !ok {
			return nil, Permanent(errors.New("queue.Steps handler run outside a worker"))
		}
		res, err := store.RunSteps(ctx, f, t.ID, steps, task.StepConfig{Worker: f.w.worker, Initial: t.Parameters})
		if err != nil {
			var tl *task.StateTooLargeError
			if errors.As(err, &tl) || errors.Is(err, task.ErrStepsChanged) {
				return nil, Permanent(err)
			}
			return nil, err
		}
		return res.State, nil
	}
}
