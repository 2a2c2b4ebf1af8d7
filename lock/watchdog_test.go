package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/lock"
)

// A Watchdog is armed once: a second Start (reachable by a user through
// the lock types that embed it) keeps the holding's context and renewals,
// and the release that ends them is the first config's.
func TestWatchdogStartsOnce(t *testing.T) {
	t.Parallel()
	released := 0
	var w lock.Watchdog
	w.Start(time.Now(), lock.WatchdogConfig{Backend: "test", Name: "a", Token: 1, TTL: time.Hour,
		Extend:  func(context.Context) (error, error) { return nil, nil },
		Release: func(context.Context) error { released++; return nil }})
	ctx := w.Context()
	w.Start(time.Now(), lock.WatchdogConfig{Backend: "test", Name: "b", Token: 2, TTL: time.Millisecond,
		Extend:  func(context.Context) (error, error) { return errors.New("second config renewed"), nil },
		Release: func(context.Context) error { t.Error("the second config's release ran"); return nil }})
	if w.Context() != ctx {
		t.Fatal("a second Start replaced the holding's context")
	}
	if err := w.Err(); err != nil {
		t.Fatalf("held lock reports %v after a second Start (its TTL would have been 1 ms)", err)
	}
	if err := w.Release(context.Background()); err != nil || released != 1 {
		t.Fatalf("release: %v, %d releases of the first config", err, released)
	}
	if !errors.Is(context.Cause(ctx), lock.ErrReleased) {
		t.Fatalf("context cause after release = %v", context.Cause(ctx))
	}
}
