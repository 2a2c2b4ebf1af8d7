// Package lifecycle is the one start/stop shape of drover's long-lived
// components: a component runs one goroutine (or a tree of them under one
// context) that Start begins and Stop ends, and both are safe to call in
// any order and any number of times.
//
//	var lc lifecycle.Lifecycle
//	lc.Start(ctx, func(ctx context.Context) { ... until ctx is done ... })
//	err := lc.Stop(shutdownCtx) // cancels run's ctx (cause ErrStopped), waits for it
//
// Rules it keeps: Stop before Start is fine and makes a later Start a no-op
// (a component that was told to stop never starts); a second Start is a
// no-op; Stop waits for run to return, bounded by its own context; the
// context run gets is cancelled with ErrStopped as its cause, so code
// below it can tell a shutdown from a failure (context.Cause).
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// ErrStopped is the cause of the context a run function gets when Stop
// ends it.
var ErrStopped = errors.New("lifecycle: stopped")

// Lifecycle runs one function from Start until Stop. The zero value is
// ready to use; it must not be copied after first use.
type Lifecycle struct {
	mu      sync.Mutex
	started bool
	stopped bool
	cancel  context.CancelCauseFunc
	done    chan struct{} // closed when run returns (or at Stop, if never started)
}

// doneLocked returns the done channel, making it on first use.
func (l *Lifecycle) doneLocked() chan struct{} {
	if l.done == nil {
		l.done = make(chan struct{})
	}
	return l.done
}

// Start runs run in a new goroutine with a context derived from ctx that
// Stop cancels. It reports whether it started run: false after an earlier
// Start, or after Stop.
func (l *Lifecycle) Start(ctx context.Context, run func(ctx context.Context)) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.started || l.stopped {
		return false
	}
	l.started = true
	rctx, cancel := context.WithCancelCause(ctx)
	l.cancel = cancel
	done := l.doneLocked()
	go func() {
		defer close(done)
		defer cancel(nil)
		run(rctx)
	}()
	return true
}

// Stop cancels the running function's context with cause ErrStopped and
// waits until it returns or ctx ends; the latter is reported as an error
// wrapping ctx's. Stop before Start, and every Stop after the first, only
// wait for the same end.
func (l *Lifecycle) Stop(ctx context.Context) error {
	l.mu.Lock()
	done := l.doneLocked()
	if !l.stopped {
		l.stopped = true
		if l.started {
			l.cancel(ErrStopped)
		} else {
			close(done)
		}
	}
	l.mu.Unlock()
	select { // an end already there wins over an ended ctx
	case <-done:
		return nil
	default:
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("lifecycle: stop: still running when the wait ended: %w", context.Cause(ctx))
	}
}

// Done is closed when the run function has returned, or when Stop was
// called on a Lifecycle that never started.
func (l *Lifecycle) Done() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.doneLocked()
}
