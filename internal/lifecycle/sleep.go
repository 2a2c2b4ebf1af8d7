package lifecycle

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx ends, whichever is first, and returns
// ctx's cause in the second case. Retry loops use it instead of
// time.Sleep so that a cancelled caller, or a component told to stop, is
// not held for the rest of a back-off.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return context.Cause(ctx)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
