package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// streamFence is a task's claim as the writer of its stream: its writes
// are fenced by the claim's compares.
type streamFence struct {
	f    lease.Fence
	cmps []clientv3.Cmp
}

func (f streamFence) Token() int64             { return f.f.Token() }
func (f streamFence) Compares() []clientv3.Cmp { return f.cmps }
func (f streamFence) Err() error               { return f.f.Err() }

// StreamFence returns the claim of task id held through f (an etcd
// lock's, or the lock of another backend fenced by the task's fence key)
// as the fence of the task's stream; nil for a fence of another kind.
func (s *Store) StreamFence(id string, f lease.Fence) stream.Fence {
	switch l := f.(type) {
	case *lock.EtcdLock:
		return streamFence{f: f, cmps: []clientv3.Cmp{l.Cmp()}}
	case *lockFence:
		return streamFence{f: f, cmps: []clientv3.Cmp{TokenFenceCmp(s.keys.TaskFence(id), l.Token())}}
	}
	return nil
}

// TokenFenceCmp holds while the fence key key (lease.TokenSpec) is at
// token: no later holder of the lock has taken it since.
func TokenFenceCmp(key string, token int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.Value(key), "=", lease.PadToken(token))
}

// beginStream opens the stream of the Run that holds task id with f: the
// steps' stream.Emit writes there, as the attempt that follows the last
// one that wrote the stream. A fence the stream cannot take (nil
// StreamFence) leaves the steps without a stream.
func (r *Runner) beginStream(ctx context.Context, id string, f lease.Fence) (context.Context, *stream.Attempt, error) {
	sf := r.store.StreamFence(id, f)
	if sf == nil {
		return ctx, nil, nil
	}
	n, _, _, err := stream.For(r.store.cli, r.store.keys).NextAttempt(ctx, id, f.Token())
	if err != nil {
		return ctx, nil, fmt.Errorf("task %s: %w", id, err)
	}
	sctx, at := stream.Begin(ctx, r.store.cli, r.store.keys, stream.Claim{Task: id, Attempt: n, Worker: r.worker, Fence: sf}, false)
	return sctx, at, nil
}

// endStream closes the stream of a Run that ended with res and err,
// while its claim still holds: a completed task's stream ends with done
// (after its last event, whichever attempt wrote it); a run that parked
// the task (a sleep, a wait) or failed ends its attempt with
// attempt_ended, if it wrote (or a step's process may have). A run that
// lost its claim writes nothing: the next attempt marks the boundary.
func (r *Runner) endStream(ctx context.Context, at *stream.Attempt, f lease.Fence, res Result, err error) {
	if at == nil || res.AlreadyCompleted {
		return
	}
	outcome := "failed"
	switch {
	case err != nil && (f.Err() != nil || errors.Is(err, lease.ErrFenced)):
		return
	case err != nil:
	case !res.SleepingUntil.IsZero():
		outcome = "sleeping"
	case res.Waiting != nil:
		outcome = "waiting"
	default:
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = at.Flush(fctx)
		if ferr := stream.For(r.store.cli, r.store.keys).Finish(fctx, res.TaskID, "succeeded", ""); ferr != nil {
			r.logger.Debug("task: the done of a task was not written to its stream", "task", res.TaskID, "err", ferr)
		}
		return
	}
	if eerr := at.End(ctx, stream.AttemptEnded, outcome, err); eerr != nil {
		r.logger.Debug("task: the end of a run was not written to its stream", "task", res.TaskID, "err", eerr)
	}
}

// flushStream waits until the events a step emitted are stored, before
// its checkpoint says it ran: a resumed task never finds a step done
// whose events are missing. An error of the stream is the step's own to
// see (stream.Emit returns it); the checkpoint's fence decides.
func flushStream(ctx context.Context) {
	at := stream.FromContext(ctx)
	if at == nil {
		return
	}
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	_ = at.Flush(fctx)
}
