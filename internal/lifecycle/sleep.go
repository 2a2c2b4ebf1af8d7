package lifecycle

import (
	"context"
	"fmt"
	"time"
)

// Sleep waits for d or until ctx ends, whichever is first. Retry loops use
// it instead of time.Sleep so that a cancelled caller, or a component told
// to stop, is not held for the rest of a back-off. When ctx ends first the
// error matches both ctx.Err() (context.Canceled or DeadlineExceeded, which
// callers branch on) and ctx's cause, when it has another.
func Sleep(ctx context.Context, d time.Duration) error {
	if d > 0 && ctx.Err() == nil {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return nil
		case <-ctx.Done():
		}
	}
	return ended(ctx)
}

// ended is ctx's error joined with its cause when the two differ; nil
// while ctx runs.
func ended(ctx context.Context) error {
	err := ctx.Err()
	if err == nil {
		return nil
	}
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
