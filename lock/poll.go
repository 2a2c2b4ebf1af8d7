package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/droverhq/drover/tracing/otelspan"
)

// PollAcquire calls try until it takes the lock, fails other than by the
// lock being held (a *HeldError), or ctx ends; between attempts it waits a
// jittered backoff from 10 ms to 250 ms. It is Acquire for backends
// without a way to wait in line (redislock, paxoslock). When ctx ends
// after a try found the lock held, the error is that *HeldError (matching
// ErrHeld) carrying ctx's error, even if ctx ended during a later try.
func PollAcquire(ctx context.Context, name string, try func(context.Context, string) (Lock, error)) (Lock, error) {
	ctx, span := otelspan.StartLock(ctx, name)
	var waitFrom time.Time
	l, err := pollAcquire(ctx, name, try, &waitFrom)
	endLock(ctx, span, name, l, waitFrom, err)
	return l, err
}

// pollAcquire is PollAcquire without its span; it sets *waitFrom to when
// a try first found the lock held.
func pollAcquire(ctx context.Context, name string, try func(context.Context, string) (Lock, error), waitFrom *time.Time) (Lock, error) {
	backoff := 10 * time.Millisecond
	var last *HeldError // what the last answered try said
	for {
		l, err := try(ctx, name)
		var held *HeldError
		if !errors.As(err, &held) {
			if err != nil && last != nil && ctx.Err() != nil {
				// ctx ended during a try: the lock was held when last
				// asked, which says more than the try's cut-off request.
				last.Err = ctx.Err()
				return nil, last
			}
			return l, err
		}
		if last == nil {
			*waitFrom = time.Now()
		}
		last = held
		t := time.NewTimer(backoff/2 + time.Duration(rand.Int64N(int64(backoff))))
		select {
		case <-ctx.Done():
			t.Stop()
			held.Err = ctx.Err()
			return nil, held
		case <-t.C:
		}
		backoff = min(2*backoff, 250*time.Millisecond)
	}
}
