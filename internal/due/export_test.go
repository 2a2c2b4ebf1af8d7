package due

import (
	"context"
	"time"
)

// SetPause makes ix's Run call pause instead of sleeping between tries.
func SetPause(ix *Index, pause func(ctx context.Context, d time.Duration)) { ix.pause = pause }

// RetryBase and RetryMax are Run's least and most pause before jitter.
const RetryBase, RetryMax = retryBase, retryMax
