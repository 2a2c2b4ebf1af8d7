package lock

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"
)

// Watchdog keeps a lock held on a backend whose holdings expire after a
// TTL (Redis in package redislock, the Paxos lock service in package
// paxoslock): a timer renews the holding every TTL/3, with no goroutine
// waiting in between. A renewal the backend refuses, or no renewal
// succeeding before the TTL runs out, loses the lock (its context is
// cancelled with a *LostError); a renewal that fails otherwise is tried
// again soon. The lock types of those backends embed it by value, so they
// share Context, Err and Release; Start arms it.
type Watchdog struct {
	cfg WatchdogConfig

	ctx     context.Context
	cancel  context.CancelCauseFunc
	mu      sync.Mutex
	timer   *time.Timer // fires the next renewal
	renewed time.Time   // when the last successful renewal (or the acquire) was sent
}

// WatchdogConfig is what a Watchdog renews, and how.
type WatchdogConfig struct {
	// Backend names the backend in logs: "redis", "paxos".
	Backend string
	// Name and Token are the lock's.
	Name  string
	Token int64
	// TTL is the holding's lease: renewals run every TTL/3.
	TTL    time.Duration
	Logger *slog.Logger
	// Extend renews the holding for TTL. lost is non-nil when the backend
	// answered that the holding is gone; err when it could not answer.
	Extend func(ctx context.Context) (lost, err error)
	// Release frees the holding if it still holds Token.
	Release func(ctx context.Context) error
}

// Start begins the holding described by cfg, taken (or last renewed) at
// at, and arms the first renewal. The backend calls it once, before the
// lock is handed out; a later call (a user's, through the lock type that
// embeds the watchdog) changes nothing.
func (w *Watchdog) Start(at time.Time, cfg WatchdogConfig) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.timer != nil {
		return
	}
	w.cfg = cfg
	w.renewed = at
	w.ctx, w.cancel = context.WithCancelCause(context.Background())
	w.timer = time.AfterFunc(w.cfg.TTL/3, w.renew)
}

// Context is cancelled when the watchdog's renewal is refused or does not
// succeed within the TTL, or when the lock is released.
func (w *Watchdog) Context() context.Context { return w.ctx }

// Err returns nil while the lock is held as far as this process knows. It
// checks the TTL deadline itself, so it is exact right after a pause.
func (w *Watchdog) Err() error {
	w.mu.Lock()
	late := time.Since(w.renewed) > w.cfg.TTL
	w.mu.Unlock()
	if late {
		w.lose(errors.New("renewal deadline passed"))
	}
	if w.ctx.Err() != nil {
		return context.Cause(w.ctx)
	}
	return nil
}

func (w *Watchdog) lose(cause error) {
	LoseOnce(w.ctx, w.cancel, w.cfg.Logger, w.cfg.Backend, w.cfg.Name, w.cfg.Token, cause)
}

// renew is the timer's work: one renewal, bounded by the TTL deadline.
func (w *Watchdog) renew() {
	if w.ctx.Err() != nil {
		return
	}
	w.mu.Lock()
	deadline := w.renewed.Add(w.cfg.TTL)
	w.mu.Unlock()
	if !time.Now().Before(deadline) {
		w.lose(errors.New("renewal deadline passed"))
		return
	}
	sent := time.Now()
	ctx, cancel := context.WithDeadline(w.ctx, deadline)
	lost, err := w.cfg.Extend(ctx)
	cancel()
	switch {
	case lost != nil:
		w.lose(lost)
	case err == nil:
		w.mu.Lock()
		w.renewed = sent
		w.timer.Reset(w.cfg.TTL / 3)
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
func (w *Watchdog) Release(ctx context.Context) error {
	err := w.cfg.Release(ctx)
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

// LoseOnce cancels a holding's context with a *LostError naming cause,
// and logs the loss, the first time only: later calls do nothing. For
// lock types that keep their own context (a Watchdog does it for those
// that embed one).
func LoseOnce(ctx context.Context, cancel context.CancelCauseFunc, logger *slog.Logger, backend, name string, token int64, cause error) {
	if ctx.Err() != nil {
		return
	}
	err := &LostError{Name: name, Token: token, Cause: cause}
	cancel(err)
	if context.Cause(ctx) == error(err) {
		logger.Warn("lock lost", "lock", name, "token", token, "backend", backend, "cause", cause.Error())
	}
}
