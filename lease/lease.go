package lease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits of a lease's TTL. etcd counts lease TTLs in whole seconds; a TTL that
// is not a whole number of seconds is rounded up, and etcd raises a TTL under
// its own minimum (2 s with default settings) to that minimum; [Lease.TTL]
// reports what etcd granted.
const (
	MinTTL = time.Second
	MaxTTL = 24 * time.Hour
)

// retryInterval is how soon a failed renewal is tried again, while the
// deadline has not passed.
const retryInterval = 200 * time.Millisecond

var (
	// ErrLost is matched by the cause of a lost lease's context.
	ErrLost = errors.New("lease: lost")
	// ErrClosed is the cause of a lease's context after Close.
	ErrClosed = errors.New("lease: closed")
)

// LostError says which lease was lost and why.
type LostError struct {
	ID    clientv3.LeaseID
	Cause error
}

// Error implements error.
func (e *LostError) Error() string {
	return fmt.Sprintf("lease %x lost: %v", int64(e.ID), e.Cause)
}

// Unwrap returns ErrLost and the cause.
func (e *LostError) Unwrap() []error { return []error{ErrLost, e.Cause} }

// CheckTTL returns a [drover.InputError] for field unless MinTTL <= ttl <= MaxTTL.
func CheckTTL(field string, ttl time.Duration) error {
	return drover.CheckDuration(field, ttl, MinTTL, MaxTTL)
}

// Option changes how Grant keeps a lease.
type Option func(*options)

type options struct {
	logger   *slog.Logger
	interval time.Duration
}

// WithLogger sets where the lease's loss is logged. Default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRenewInterval sets how often the lease is renewed. Default TTL/3; it is
// capped at TTL/2 so that one failed renewal never loses the lease on its own.
func WithRenewInterval(d time.Duration) Option { return func(o *options) { o.interval = d } }

// Lease is an etcd lease renewed in the background until it is lost or closed.
// It is safe for concurrent use.
type Lease struct {
	cli    *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration
	logger *slog.Logger

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	deadline time.Time // when the lease may have expired on the server
	renewed  time.Time // when the last successful renewal was sent

	run       context.Context // cancelled by Close: the renewal loop ends
	stop      context.CancelFunc
	done      chan struct{} // closed when the renewal loop has ended
	closeOnce sync.Once
	closeErr  error
	attached  bool // kept alive by someone else (Attach): never revoked here
}

// Grant creates a lease with the given TTL and starts renewing it. The TTL
// must be within [MinTTL, MaxTTL]; it is rounded up to whole seconds.
func Grant(ctx context.Context, cli *clientv3.Client, ttl time.Duration, opts ...Option) (*Lease, error) {
	if err := CheckTTL("ttl", ttl); err != nil {
		return nil, err
	}
	o := options{logger: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	secs := int64(math.Ceil(ttl.Seconds()))
	sent := time.Now()
	resp, err := cli.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("lease: grant %ds lease: %w", secs, err)
	}
	// etcd may grant more than asked: it raises TTLs to its minimum (about
	// 1.5 election timeouts, 2 s with default settings).
	ttl = time.Duration(max(resp.TTL, secs)) * time.Second
	interval := o.interval
	if interval <= 0 {
		interval = ttl / 3
	}
	interval = min(interval, ttl/2)
	ctx2, cancel := context.WithCancelCause(context.Background())
	l := &Lease{
		cli:      cli,
		id:       resp.ID,
		ttl:      ttl,
		logger:   o.logger,
		ctx:      ctx2,
		cancel:   cancel,
		deadline: sent.Add(time.Duration(resp.TTL) * time.Second),
		renewed:  sent,
		done:     make(chan struct{}),
	}
	l.run, l.stop = context.WithCancel(context.Background())
	go l.renew(interval)
	return l, nil
}

// ID returns the etcd lease ID, for binding keys to the lease.
func (l *Lease) ID() clientv3.LeaseID { return l.id }

// TTL returns the lease's time to live.
func (l *Lease) TTL() time.Duration { return l.ttl }

// Context returns a context that is cancelled when the lease is lost or
// closed. context.Cause tells which: a [LostError] or [ErrClosed].
func (l *Lease) Context() context.Context { return l.ctx }

// Done is Context().Done().
func (l *Lease) Done() <-chan struct{} { return l.ctx.Done() }

// Err returns nil while the lease is held, and the cause once it is lost or
// closed. It checks the renewal deadline itself, so it is exact even when the
// process has just woken from a pause and the renewal loop has not yet run.
func (l *Lease) Err() error {
	l.mu.Lock()
	late := time.Now().After(l.deadline)
	l.mu.Unlock()
	if late {
		l.lose(errors.New("renewal deadline passed"))
	}
	if l.ctx.Err() != nil {
		return context.Cause(l.ctx)
	}
	return nil
}

// Deadline returns when the lease is taken as lost unless a renewal succeeds
// first: the send time of the last successful renewal plus the TTL etcd
// granted. The server cannot expire the lease earlier than this.
func (l *Lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// Renewed returns when the last successful renewal (or the grant) was sent.
func (l *Lease) Renewed() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.renewed
}

// lose cancels the lease's context with a LostError, and logs the loss, once.
func (l *Lease) lose(cause error) {
	if l.ctx.Err() != nil {
		return
	}
	err := &LostError{ID: l.id, Cause: cause}
	l.mu.Lock()
	first := l.ctx.Err() == nil
	if first {
		l.cancel(err)
	}
	l.mu.Unlock()
	if first {
		metrics.LeaseLosses.Inc()
		l.logger.Warn("lease lost", "lease", fmt.Sprintf("%x", int64(l.id)), "cause", cause.Error())
	}
}

// renew is the one goroutine that renews the lease. It ends when the lease is
// lost or Close is called.
func (l *Lease) renew(interval time.Duration) {
	defer close(l.done)
	timer := time.NewTimer(interval)
	defer timer.Stop()
	var lastErr error
	for {
		select {
		case <-l.run.Done():
			return
		case <-l.ctx.Done():
			return
		case <-timer.C:
		}
		deadline := l.Deadline()
		if !time.Now().Before(deadline) {
			if lastErr == nil {
				lastErr = errors.New("no renewal answered")
			}
			l.lose(fmt.Errorf("renewal deadline passed: %w", lastErr))
			return
		}
		sent := time.Now()
		ctx, cancel := context.WithDeadline(l.run, deadline)
		resp, err := l.cli.KeepAliveOnce(ctx, l.id)
		cancel()
		switch {
		case err == nil:
			lastErr = nil
			l.mu.Lock()
			l.renewed = sent
			l.deadline = sent.Add(time.Duration(resp.TTL) * time.Second)
			l.mu.Unlock()
			timer.Reset(interval)
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			l.lose(errors.New("etcd reports the lease expired or revoked"))
			return
		case l.run.Err() != nil:
			return
		default:
			lastErr = err
			timer.Reset(min(retryInterval, time.Until(deadline)))
		}
	}
}

// Close stops renewing and revokes the lease, so that every key bound to it
// is deleted at once, and cancels the lease's context with [ErrClosed]. The
// revoke waits for etcd no longer than ctx allows and no longer than the
// lease's deadline, after which etcd expires the lease by itself. The
// renewal goroutine has ended when Close returns. Close is safe to call more
// than once and after the lease was lost; a lost lease is not revoked.
func (l *Lease) Close(ctx context.Context) error {
	l.closeOnce.Do(func() {
		l.stop()
		<-l.done
		l.mu.Lock()
		lost := l.ctx.Err() != nil
		if !lost {
			l.cancel(ErrClosed)
		}
		l.mu.Unlock()
		if lost || l.attached {
			return
		}
		// Past the deadline the server has expired the lease itself; do
		// not wait longer than that for an etcd that does not answer.
		rctx, cancel := context.WithDeadline(ctx, l.Deadline())
		defer cancel()
		if _, err := l.cli.Revoke(rctx, l.id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
			l.closeErr = fmt.Errorf("lease: revoke %x: %w", int64(l.id), err)
		}
	})
	return l.closeErr
}

// Attach returns lease id, which someone else keeps alive (an HTTP
// client's session), for binding keys to it and fencing by it for the
// length of one request, without a round trip: etcd itself refuses a key
// bound to a lease it no longer has. deadline is when the caller knows the
// lease may have expired; Err reports it once passed. The lease is never
// renewed, and Close only cancels its context: it is not revoked.
func Attach(cli *clientv3.Client, id clientv3.LeaseID, ttl time.Duration, deadline time.Time) *Lease {
	lctx, cancel := context.WithCancelCause(context.Background())
	l := &Lease{
		cli:      cli,
		id:       id,
		ttl:      ttl,
		logger:   slog.Default(),
		ctx:      lctx,
		cancel:   cancel,
		deadline: deadline,
		renewed:  time.Now(),
		done:     make(chan struct{}),
		attached: true,
	}
	l.run, l.stop = context.WithCancel(context.Background())
	close(l.done)
	return l
}
