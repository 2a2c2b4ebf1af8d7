package lock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// watchdog keeps a lock held on a backend whose holdings expire after a
// TTL (Redis, the Paxos lock service): a timer renews the holding every
// TTL/3, with no goroutine waiting in between. A renewal the backend
// refuses, or no renewal succeeding before the TTL runs out, loses the
// lock (its context is cancelled with a *LostError); a renewal that fails
// otherwise is tried again soon. The lock types of those backends embed
// it, so they share Context, Err and Release.
type watchdog struct {
	backend string // in logs: "redis", "paxos"
	name    string
	token   int64
	ttl     time.Duration
	logger  *slog.Logger
	// extend renews the holding for ttl. lost is non-nil when the backend
	// answered that the holding is gone; err when it could not answer.
	extend func(ctx context.Context) (lost, err error)
	// release frees the holding if it still holds token.
	release func(ctx context.Context) error

	ctx     context.Context
	cancel  context.CancelCauseFunc
	mu      sync.Mutex
	timer   *time.Timer // fires the next renewal
	renewed time.Time   // when the last successful renewal (or the acquire) was sent
}

// start begins the holding, taken (or last renewed) at at, and arms the
// first renewal.
func (w *watchdog) start(at time.Time) {
	w.renewed = at
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	w.mu.Lock()
	w.timer = time.AfterFunc(w.ttl/3, w.renew)
	w.mu.Unlock()
}

// Context is cancelled when the watchdog's renewal is refused or does not
// succeed within the TTL, or when the lock is released.
func (w *watchdog) Context() context.Context { return w.ctx }

// Err returns nil while the lock is held as far as this process knows. It
// checks the TTL deadline itself, so it is exact right after a pause.
func (w *watchdog) Err() error {
	w.mu.Lock()
	late := time.Since(w.renewed) > w.ttl
	w.mu.Unlock()
	if late {
		w.lose(errors.New("renewal deadline passed"))
	}
	if w.ctx.Err() != nil {
		return context.Cause(w.ctx)
	}
	return nil
}

func (w *watchdog) lose(cause error) {
	loseOnce(w.ctx, w.cancel, w.logger, w.backend, w.name, w.token, cause)
}

// renew is the timer's work: one renewal, bounded by the TTL deadline.
func (w *watchdog) renew() {
	if w.ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	deadline := w.renewed.Add(w.ttl)
	w.mu.Unlock()
	if !time.Now().Before(deadline) {
		w.lose(errors.New("renewal deadline passed"))
		return
	}
	sent := time.Now()
	ctx, cancel := context.WithDeadline(w.ctx, deadline)
	lost, err := w.extend(ctx)
	cancel()
	switch {
	case lost != nil:
		w.lose(lost)
	case err == nil:
		w.mu.Lock()
		w.renewed = sent
		w.timer.Reset(w.ttl / 3)
		w.mu.Unlock()
	case w.ctx.Err() != nil:
	default:
		w.mu.Lock()
		w.timer.Reset(min(200*time.Millisecond, max(time.Until(deadline), 0)))
		w.mu.Unlock()
	}
}

// Release frees the lock if it still holds this token, cancels its
// context and stops its renewals. Releasing a lock that was lost returns a
// *NotHeldError.
func (w *watchdog) Release(ctx context.Context) error {
	err := w.release(ctx)
	switch {
	case err == nil:
		w.cancel(ErrReleased)
	case errors.Is(err, ErrNotHeld):
		w.lose(errors.New("released after the lock was lost"))
	default:
		return err
	}
	w.mu.Lock()
	w.timer.Stop()
	w.mu.Unlock()
	return err
}
