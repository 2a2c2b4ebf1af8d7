// Package process is one drover process in the fleet: its primary lease,
// the root context everything it starts runs under, and its shutdown.
//
// A Runtime grants the process's primary lease (TTL 10 s by default) and
// renews it with a deadline. Everything the process registers is bound to
// that lease, so it all disappears by itself when the process dies. When the
// lease is lost (the renewal deadline passed, or etcd says the lease expired
// or was revoked), the runtime's root context is cancelled with the
// [lease.LostError] as its cause: every goroutine started with [Runtime.Go]
// and every call made with [Runtime.Context] stops, and the process shuts
// down gracefully. This is NVIDIA Dynamo's CancellationToken contract in
// Go's own idiom.
//
// A process may opt into surviving a lease loss instead ([WithReRegister]):
// the root context stays alive, a new lease is granted, and registrations
// are re-created under it. The trade-off: for the time between the loss and
// the new registration the process is invisible to discovery, and anything
// that was bound to the old lease (locks, task claims) is gone regardless, so
// only processes whose work does not depend on an unbroken lease (stateless
// model servers, routers) should choose it.
package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultTTL is the primary lease's TTL when none is given.
const DefaultTTL = 10 * time.Second

// ErrShutdown is the cause of the root context after Shutdown, and the
// error of Go once the runtime is shutting down.
var ErrShutdown = errors.New("process: shut down")

// Option changes how Start builds a Runtime.
type Option func(*options)

type options struct {
	ttl        time.Duration
	logger     *slog.Logger
	namespace  string
	reRegister bool
}

// WithTTL sets the primary lease's TTL (default [DefaultTTL]; between
// [lease.MinTTL] and [lease.MaxTTL]).
func WithTTL(ttl time.Duration) Option { return func(o *options) { o.ttl = ttl } }

// WithLogger sets where the runtime logs lease losses and renewals. Default
// slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithNamespace sets the key namespace the runtime's registrations live in
// (default [keyspace.DefaultNamespace]).
func WithNamespace(ns string) Option { return func(o *options) { o.namespace = ns } }

// WithReRegister makes the runtime survive a lease loss: it grants a new
// lease and lets registrations re-create their keys under it, instead of
// cancelling the root context. See the package documentation for the
// trade-off.
func WithReRegister() Option { return func(o *options) { o.reRegister = true } }

// Runtime is one process's primary lease and root context. It is safe for
// concurrent use.
type Runtime struct {
	cli        *clientv3.Client
	space      keyspace.Space
	ttl        time.Duration
	logger     *slog.Logger
	reRegister bool

	ctx    context.Context
	cancel context.CancelCauseFunc

	mu       sync.Mutex
	lease    *lease.Lease
	changed  chan struct{} // closed when lease is replaced
	stopping bool
	tasks    sync.WaitGroup

	supervised chan struct{} // closed when the supervisor has ended
	shutOnce   sync.Once
	shutErr    error
}

// Start grants the primary lease and returns a running Runtime. ctx bounds
// only the grant; the runtime lives until Shutdown or, unless
// [WithReRegister] was given, until its lease is lost.
func Start(ctx context.Context, cli *clientv3.Client, opts ...Option) (*Runtime, error) {
	o := options{ttl: DefaultTTL, logger: slog.Default()}
	for _, opt := range opts {
		opt(&o)
	}
	space, err := keyspace.New(o.namespace)
	if err != nil {
		return nil, err
	}
	if err := lease.CheckTTL("ttl", o.ttl); err != nil {
		return nil, err
	}
	l, err := lease.Grant(ctx, cli, o.ttl, lease.WithLogger(o.logger))
	if err != nil {
		return nil, fmt.Errorf("process: %w", err)
	}
	r := &Runtime{
		cli: cli, space: space, ttl: o.ttl, logger: o.logger, reRegister: o.reRegister,
		lease: l, changed: make(chan struct{}), supervised: make(chan struct{}),
	}
	r.ctx, r.cancel = context.WithCancelCause(context.Background())
	go r.supervise()
	return r, nil
}

// Client returns the etcd client the runtime uses.
func (r *Runtime) Client() *clientv3.Client { return r.cli }

// Keys returns the key space of the runtime's namespace.
func (r *Runtime) Keys() keyspace.Space { return r.space }

// Namespace returns the name of the runtime's namespace.
func (r *Runtime) Namespace() string { return r.space.Namespace() }

// Logger returns the runtime's logger.
func (r *Runtime) Logger() *slog.Logger { return r.logger }

// Context returns the root context: cancelled by Shutdown (cause
// [ErrShutdown]) or, unless [WithReRegister] was given, by the loss of the
// primary lease (cause a [lease.LostError]).
func (r *Runtime) Context() context.Context { return r.ctx }

// Done is Context().Done().
func (r *Runtime) Done() <-chan struct{} { return r.ctx.Done() }

// Err returns nil while the runtime runs, and then why it stopped.
func (r *Runtime) Err() error {
	if r.ctx.Err() == nil {
		return nil
	}
	return context.Cause(r.ctx)
}

// Lease returns the current primary lease. With [WithReRegister] it changes
// after a loss; use [Runtime.NextLease] to wait for the replacement.
func (r *Runtime) Lease() *lease.Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lease
}

// NextLease returns the current primary lease if it is not old, and
// otherwise waits until a new one replaces old. It fails when ctx ends or
// the runtime stops first.
func (r *Runtime) NextLease(ctx context.Context, old *lease.Lease) (*lease.Lease, error) {
	for {
		r.mu.Lock()
		l, changed := r.lease, r.changed
		r.mu.Unlock()
		if l != old {
			return l, nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		case <-r.ctx.Done():
			return nil, context.Cause(r.ctx)
		}
	}
}

// Go runs fn in a goroutine with the root context, and Shutdown waits for
// it to return. fn must return once its context is done. Go returns
// [ErrShutdown] and runs nothing once the runtime is shutting down.
func (r *Runtime) Go(fn func(ctx context.Context)) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return ErrShutdown
	}
	r.tasks.Add(1)
	go func() {
		defer r.tasks.Done()
		fn(r.ctx)
	}()
	return nil
}

// supervise follows the primary lease: on its loss it cancels the root
// context or, with WithReRegister, grants a new lease.
func (r *Runtime) supervise() {
	defer close(r.supervised)
	backoff := 200 * time.Millisecond
	for {
		l := r.Lease()
		select {
		case <-r.ctx.Done():
			return
		case <-l.Done():
		}
		cause := context.Cause(l.Context())
		if errors.Is(cause, lease.ErrClosed) {
			return
		}
		if !r.reRegister {
			r.logger.Error("primary lease lost: shutting down", "lease", fmt.Sprintf("%x", int64(l.ID())), "cause", cause.Error())
			r.cancel(cause)
			return
		}
		r.logger.Warn("primary lease lost: granting a new one and registering again", "lease", fmt.Sprintf("%x", int64(l.ID())), "cause", cause.Error())
		// The old lease may still live on the server for a moment (lost by
		// deadline while etcd was unreachable): revoke it so that nothing
		// stays registered under it.
		rctx, cancel := context.WithTimeout(r.ctx, time.Second)
		_, _ = r.cli.Revoke(rctx, l.ID())
		cancel()
		for {
			nl, err := lease.Grant(r.ctx, r.cli, r.ttl, lease.WithLogger(r.logger))
			if err == nil {
				r.mu.Lock()
				r.lease = nl
				close(r.changed)
				r.changed = make(chan struct{})
				r.mu.Unlock()
				r.logger.Info("primary lease granted", "lease", fmt.Sprintf("%x", int64(nl.ID())))
				backoff = 200 * time.Millisecond
				break
			}
			if r.ctx.Err() != nil {
				return
			}
			r.logger.Warn("cannot grant a new primary lease yet", "err", err, "retry_in", backoff)
			select {
			case <-r.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 5*time.Second)
		}
	}
}

// Close is Shutdown: every long-lived component of drover stops with
// Close(ctx) error.
func (r *Runtime) Close(ctx context.Context) error { return r.Shutdown(ctx) }

// Shutdown stops the runtime: it cancels the root context (cause
// [ErrShutdown] unless it was already cancelled by a lease loss), waits for
// every goroutine started with Go, and revokes the primary lease so that
// everything registered under it disappears at once. It waits for the
// goroutines no longer than ctx allows, and then returns ctx's error with the
// lease revoked anyway; the revoke itself takes at most 2 s more.
// Shutdown is safe to call more than once.
func (r *Runtime) Shutdown(ctx context.Context) error {
	r.shutOnce.Do(func() {
		r.mu.Lock()
		r.stopping = true
		r.mu.Unlock()
		r.cancel(ErrShutdown)
		<-r.supervised
		done := make(chan struct{})
		go func() { r.tasks.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			r.shutErr = fmt.Errorf("process: shutdown: tasks still running: %w", ctx.Err())
		}
		// Revoke with a fresh bound: an expired ctx must not leave the
		// process registered for a whole TTL.
		rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := r.Lease().Close(rctx); err != nil && r.shutErr == nil {
			r.shutErr = fmt.Errorf("process: shutdown: %w", err)
		}
	})
	return r.shutErr
}
