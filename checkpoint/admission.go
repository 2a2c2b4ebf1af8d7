package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Admission is what happens when a run starts on a thread that another run
// holds.
type Admission string

// Admission policies.
const (
	// Reject fails the new run at once with ErrBusy.
	Reject Admission = "reject"
	// Enqueue makes the new run wait its turn (first come, first served on
	// the etcd lock; by polling on Redis backends).
	Enqueue Admission = "enqueue"
	// Interrupt cancels the running one's context (cause ErrInterrupted);
	// the new run takes over once it has released the thread.
	Interrupt Admission = "interrupt"
)

var (
	// ErrBusy: another run holds the thread (Reject).
	ErrBusy = errors.New("checkpoint: thread busy: another run holds it")
	// ErrInterrupted is the cause of a run's context when a newer run
	// interrupted it.
	ErrInterrupted = errors.New("checkpoint: run interrupted by a newer run on the thread")
)

// Admitter admits runs on threads under a policy: the run holds the thread's
// lock (any lock backend) for as long as it runs, and interrupt requests
// travel through etcd.
type Admitter struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	locker lock.Locker
}

// NewAdmitter returns an admitter of namespace ns whose runs hold locks from
// locker.
func NewAdmitter(cli *clientv3.Client, ns string, locker lock.Locker) (*Admitter, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	return &Admitter{cli: cli, keys: keys, locker: locker}, nil
}

// Run is an admitted run on a thread. Pass Context to the run's steps and
// Lock as the fence of its checkpoint writes.
type Run struct {
	Lock   lock.Lock
	ctx    context.Context
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// Context ends when the run's lock is lost or released, or a newer run
// interrupts it (context.Cause is ErrInterrupted).
func (r *Run) Context() context.Context { return r.ctx }

// Release ends the run and gives the thread to the next one.
func (r *Run) Release(ctx context.Context) error {
	r.cancel(lock.ErrReleased)
	<-r.done
	return r.Lock.Release(ctx)
}

func (a *Admitter) interruptKey(thread string) string {
	return a.keys.CheckpointInterrupt(thread)
}

// Admit starts a run on thread under policy; ctx bounds the wait.
func (a *Admitter) Admit(ctx context.Context, thread string, policy Admission) (*Run, error) {
	if err := keyspace.CheckName("thread_id", thread); err != nil {
		return nil, err
	}
	name := keyspace.ThreadLock(thread)
	var l lock.Lock
	var err error
	switch policy {
	case Reject:
		l, err = a.locker.TryAcquire(ctx, name)
		if errors.Is(err, lock.ErrHeld) {
			return nil, fmt.Errorf("%w: %w", ErrBusy, err)
		}
	case Enqueue:
		l, err = a.locker.Acquire(ctx, name)
	case Interrupt:
		if l, err = a.locker.TryAcquire(ctx, name); errors.Is(err, lock.ErrHeld) {
			if _, perr := a.cli.Put(ctx, a.interruptKey(thread), time.Now().UTC().Format(time.RFC3339Nano)); perr != nil {
				return nil, fmt.Errorf("checkpoint: interrupt the run on %s: %w", thread, perr)
			}
			l, err = a.locker.Acquire(ctx, name)
		}
	default:
		return nil, fmt.Errorf("checkpoint: unknown admission %q: use reject, enqueue or interrupt", policy)
	}
	if err != nil {
		return nil, err
	}
	// Interrupts count from the read below, made just after the lock was
	// acquired: a request written after that read cancels this run; one
	// written before it does not, including one written in the short span
	// between the acquisition and the read. The lock API does not expose
	// the revision of its acquisition (a Locker need not be etcd's, and an
	// etcd lock's token is when it queued, not when it was granted), so
	// this read's revision is the first this run can name.
	key := a.interruptKey(thread)
	g, err := a.cli.Get(ctx, key)
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		_ = l.Release(rctx)
		cancel()
		return nil, fmt.Errorf("checkpoint: read the interrupt key of %s: %w", thread, err)
	}
	r := &Run{Lock: l, done: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancelCause(l.Context())
	go a.watchInterrupts(r, key, g.Header.Revision)
	return r, nil
}

// Bounds of the wait between two watches of an interrupt key.
const (
	minRewatch = 50 * time.Millisecond
	maxRewatch = 2 * time.Second
)

// watchInterrupts cancels r with ErrInterrupted when the interrupt key is
// written after revision rev. A watch that ends (no leader, the watch
// cancelled, a compaction) is opened again from the last revision seen; the
// loop ends with the run.
func (a *Admitter) watchInterrupts(r *Run, key string, rev int64) {
	defer close(r.done)
	backoff := minRewatch
	for r.ctx.Err() == nil {
		started := time.Now()
		next, interrupted := a.followInterrupts(r.ctx, key, rev)
		if interrupted {
			r.cancel(ErrInterrupted)
			return
		}
		if next > rev { // progress: watch again at once
			rev, backoff = next, minRewatch
			continue
		}
		if time.Since(started) > 10*maxRewatch {
			backoff = minRewatch
		}
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, maxRewatch)
	}
}

// followInterrupts watches key after rev until the watch ends; it returns
// the last revision known to hold no interrupt, and whether one was seen.
// A watch that fell behind a compaction reads the key instead: a write
// after rev is an interrupt.
func (a *Admitter) followInterrupts(ctx context.Context, key string, rev int64) (int64, bool) {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := a.cli.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterDelete(), clientv3.WithProgressNotify())
	for wr := range wch {
		if wr.CompactRevision != 0 {
			g, err := a.cli.Get(ctx, key)
			if err != nil {
				return rev, false
			}
			if len(g.Kvs) > 0 && g.Kvs[0].ModRevision > rev {
				return rev, true
			}
			return g.Header.Revision, false
		}
		if wr.Err() != nil {
			return rev, false
		}
		if len(wr.Events) > 0 {
			return rev, true
		}
		if wr.IsProgressNotify() && wr.Header.Revision > rev {
			rev = wr.Header.Revision
		}
	}
	return rev, false
}
