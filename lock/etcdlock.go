package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var _ lease.Fence = (*EtcdLock)(nil)

func (e *Etcd) newLock(name, key string, token int64, h Holder, done func(bool)) *EtcdLock {
	return &EtcdLock{locker: e, name: name, key: key, token: token, holder: h, done: done}
}

// EtcdLock is a lock held through the etcd backend.
//
// Its context is made on the first call to Context, with a watch on the
// lock's key and a link to the lease: a holder that never asks for it pays
// for neither, and Err, Txn and Release still see a loss.
type EtcdLock struct {
	locker *Etcd
	name   string
	key    string
	token  int64
	holder Holder
	done   func(reusable bool)

	mu        sync.Mutex
	cause     error // why the holding ended; nil while held
	ctx       context.Context
	cancel    context.CancelCauseFunc
	stopLease func() bool
	release   chan struct{} // closed when a Release in progress returns
}

// releasing returns a channel closed when the Release in progress returns,
// or nil when none is.
func (l *EtcdLock) releasing() chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.release
}

var _ Lock = (*EtcdLock)(nil)

// Name is the lock's name.
func (l *EtcdLock) Name() string { return l.name }

// Token is the fencing token: the etcd revision at which this holder's key
// was created.
func (l *EtcdLock) Token() int64 { return l.token }

// Holder is this holder's record.
func (l *EtcdLock) Holder() Holder { return l.holder }

// Key is the etcd key that stands for this holding.
func (l *EtcdLock) Key() string { return l.key }

// Context is cancelled the moment the lock is lost (lease lost, key deleted
// by anyone) or released. The first call starts a watch on the lock's key.
func (l *EtcdLock) Context() context.Context {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ctx != nil {
		return l.ctx
	}
	l.ctx, l.cancel = context.WithCancelCause(context.Background())
	if l.cause != nil {
		l.cancel(l.cause)
		return l.ctx
	}
	lctx := l.locker.lease.Context()
	l.stopLease = context.AfterFunc(lctx, func() { l.leaseEnded(context.Cause(lctx)) })
	go l.watch(l.ctx)
	return l.ctx
}

// Cmp is the comparison that holds while this lock is held with its token.
// Add it to any etcd transaction to fence it by hand; [EtcdLock.Txn] does so
// for you.
func (l *EtcdLock) Cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.token)
}

// Err returns nil while the lock is held as far as this process knows, and
// the cause once it is lost or released. It checks the lease's deadline
// itself, so it is exact right after the process wakes from a pause.
func (l *EtcdLock) Err() error {
	if err := l.locker.lease.Err(); err != nil {
		l.leaseEnded(err)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cause
}

// leaseEnded ends the holding when its lease ended: released when the locker
// was closed, lost otherwise.
func (l *EtcdLock) leaseEnded(cause error) {
	if errors.Is(cause, lease.ErrClosed) {
		l.end(fmt.Errorf("%w: the locker was closed", ErrReleased))
		return
	}
	l.lose(cause)
}

func (l *EtcdLock) lose(cause error) {
	if l.end(&LostError{Name: l.name, Token: l.token, Cause: cause}) {
		l.locker.logger.Warn("lock lost", "lock", l.name, "token", l.token, "cause", cause.Error())
	}
}

// watch cancels the lock's context when its key is deleted. It ends when the
// context is done.
func (l *EtcdLock) watch(ctx context.Context) {
	cli := l.locker.cli
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		wch := cli.Watch(clientv3.WithRequireLeader(wctx), l.key, clientv3.WithFilterPut(), clientv3.WithCreatedNotify())
		gone, err := func() (bool, error) {
			if err := watchCreated(wctx, wch); err != nil {
				return false, err
			}
			g, err := cli.Get(wctx, l.key, clientv3.WithKeysOnly())
			if err != nil {
				return false, err
			}
			if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != l.token {
				return true, nil
			}
			for wr := range wch {
				if err := wr.Err(); err != nil {
					return false, err
				}
				for _, ev := range wr.Events {
					// A deletion at or before the token's revision is of an
					// earlier holding of the same key: on a cluster the
					// watch may start on a member that has not applied this
					// acquisition yet, and replays it.
					if ev.Type == clientv3.EventTypeDelete && ev.Kv.ModRevision > l.token {
						return true, nil
					}
				}
			}
			return false, errors.New("watch closed")
		}()
		cancel()
		if gone {
			// Our own Release deletes the key too: let it finish and say
			// which it was.
			if r := l.releasing(); r != nil {
				<-r
			}
			l.lose(errors.New("lock key deleted"))
			return
		}
		if ctx.Err() != nil {
			return
		}
		l.locker.logger.Debug("lock: watch interrupted; reopening", "lock", l.name, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// Release deletes this holder's key if it still holds the lock with its
// token, and cancels the lock's context with ErrReleased.
func (l *EtcdLock) Release(ctx context.Context) error {
	l.mu.Lock()
	done := make(chan struct{})
	l.release = done
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		l.release = nil
		l.mu.Unlock()
		close(done)
	}()
	err := l.locker.releaseKey(ctx, l.name, l.key, l.token)
	switch {
	case err == nil:
		l.end(ErrReleased)
	case errors.Is(err, ErrNotHeld):
		l.lose(errors.New("released after the lock was lost"))
	}
	return err
}

// end closes the holding, once: its context (if made) is cancelled with
// cause, and its key's slot may be reused (the key is deleted, or its create
// revision no longer matches the token). It reports whether this call ended
// it.
func (l *EtcdLock) end(cause error) (first bool) {
	l.mu.Lock()
	if l.cause != nil {
		l.mu.Unlock()
		return false
	}
	l.cause = cause
	if l.cancel != nil {
		l.cancel(cause)
		l.stopLease()
	}
	l.mu.Unlock()
	l.done(true)
	return true
}

// Txn starts an etcd transaction that commits only while this lock is held
// with its token. It is used like clientv3.Txn; Commit returns the response
// of the caller's If/Then/Else, or an error matching ErrFenced, with nothing
// applied, when the lock was lost. A fenced-out lock's context is cancelled.
func (l *EtcdLock) Txn(ctx context.Context) clientv3.Txn {
	return lease.NewFencedTxn(ctx, l.locker.cli, lease.Spec{Name: fmt.Sprintf("lock %q", l.name), Token: l.token, Cmp: l.Cmp(), Check: l.Err, Lost: l.lose})
}
