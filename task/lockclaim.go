package task

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimLock is Claim for a lock of any backend (RunnerConfig.Locker:
// Redis, Redlock, the Paxos lock service). It takes task id's lock from
// locker, waiting while another holds it when o.Wait; raises the task's
// fence key (keyspace.Space.TaskFence) to the lock's token, so that from
// then on every write of an earlier holder is refused, even one made before
// this holder writes anything; and waits for a queue worker running the
// task, as Claim does. The fence it returns writes fenced by the token;
// release it when done. On error nothing is held.
func (s *Store) claimLock(ctx context.Context, locker lock.Locker, id string, o ClaimOptions) (*lockFence, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	emit := o.OnEvent
	if emit == nil {
		emit = func(Event) {}
	}
	name := keyspace.TaskLock(id)
	l, err := locker.TryAcquire(ctx, name)
	if errors.Is(err, lock.ErrHeld) && o.Wait {
		emit(waitingEvent(id, err))
		l, err = locker.Acquire(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("task %s: take the task: %w", id, err)
	}
	f := newLockFence(s, l, id)
	if _, err = f.Txn(ctx).Commit(); err != nil {
		err = fmt.Errorf("task %s: raise its fence to token %d: %w", id, l.Token(), err)
	} else {
		held := o.Held
		if held == nil {
			held = f.Context()
		}
		err = s.awaitQueue(ctx, id, held, o.Wait, emit)
	}
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = f.Release(rctx) // on failure the lock frees itself when its TTL ends
		return nil, err
	}
	return f, nil
}

// lockFence is a task held through a lock of any backend: a lease.Fence
// whose etcd transactions commit only if no write under a higher token was
// made for the task, and raise the task's fence key to this token
// (lease.NewTokenTxn). Its context is the lock's, also cancelled when etcd
// refuses a write for a higher token.
type lockFence struct {
	l      lock.Lock
	cli    *clientv3.Client
	spec   lease.TokenSpec
	ctx    context.Context
	cancel context.CancelCauseFunc
}

var _ lease.Fence = (*lockFence)(nil)

func newLockFence(s *Store, l lock.Lock, id string) *lockFence {
	f := &lockFence{l: l, cli: s.cli}
	f.ctx, f.cancel = context.WithCancelCause(l.Context())
	f.spec = lease.TokenSpec{Name: "task " + id, Key: s.keys.TaskFence(id), Token: l.Token(), Check: f.Err,
		Lost: func(cause error) { f.cancel(&lock.LostError{Name: l.Name(), Token: l.Token(), Cause: cause}) }}
	return f
}

// Token is the lock's fencing token.
func (f *lockFence) Token() int64 { return f.l.Token() }

// Txn starts an etcd transaction fenced by the lock's token.
func (f *lockFence) Txn(ctx context.Context) clientv3.Txn {
	return lease.NewTokenTxn(func() clientv3.Txn { return f.cli.Txn(ctx) }, f.spec)
}

// Context ends when the lock is lost or released, or a write was refused.
func (f *lockFence) Context() context.Context { return f.ctx }

// Err is nil while the lock is held as far as this process knows: the
// backends' locks check their renewal deadline themselves, so it is exact
// right after a pause.
func (f *lockFence) Err() error {
	if c, ok := f.l.(interface{ Err() error }); ok {
		if err := c.Err(); err != nil {
			return err
		}
	}
	if f.ctx.Err() != nil {
		return context.Cause(f.ctx)
	}
	return nil
}

// Release gives the lock up, fenced by its token in its backend, and ends
// the fence's context.
func (f *lockFence) Release(ctx context.Context) error {
	err := f.l.Release(ctx)
	f.cancel(lock.ErrReleased)
	return err
}
