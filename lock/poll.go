package lock

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// PollAcquire calls try until it takes the lock, fails other than by the
// lock being held (a *HeldError), or ctx ends; between attempts it waits a
// jittered backoff from 10 ms to 250 ms. It is Acquire for backends
// without a way to wait in line (redislock, paxoslock).
func PollAcquire(ctx context.Context, name string, try func(context.Context, string) (Lock, error)) (Lock, error) {
	backoff := 10 * time.Millisecond
	for {
		l, err := try(ctx, name)
		var held *HeldError
		if !errors.As(err, &held) {
			return l, err
		}
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
