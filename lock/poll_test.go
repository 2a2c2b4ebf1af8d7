package lock_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/lock"
)

// A wait whose context ends during a try, after an earlier try found the
// lock held, reports the lock held (with the context's error), not the
// cut-off request's error; a context that ends before any try answered
// reports the try's own error.
func TestPollAcquireReportsHeldWhenCutOffMidTry(t *testing.T) {
	t.Parallel()
	held := &lock.HeldError{Name: "job", Holder: lock.Holder{ID: "worker-a"}, Token: 7}
	tries := 0
	try := func(ctx context.Context, name string) (lock.Lock, error) {
		tries++
		if tries == 1 {
			return nil, held
		}
		<-ctx.Done() // a request the ending context cuts off
		return nil, fmt.Errorf("backend: POST /locks/%s: %w", name, ctx.Err())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	_, err := lock.PollAcquire(ctx, "job", try)
	var he *lock.HeldError
	if !errors.As(err, &he) || he.Holder.ID != "worker-a" || !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cut off mid-try after a held answer: %v, want the HeldError with DeadlineExceeded", err)
	}

	first := func(ctx context.Context, name string) (lock.Lock, error) {
		<-ctx.Done()
		return nil, fmt.Errorf("backend: %w", ctx.Err())
	}
	ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel2()
	if _, err := lock.PollAcquire(ctx2, "job", first); errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("cut off in the first try: %v, want the try's own error", err)
	}
}
