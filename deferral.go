package drover

import (
	"errors"
	"fmt"
	"time"
)

// ErrDeferred matches every *DeferError.
var ErrDeferred = errors.New("drover: deferred")

// DeferError refuses work for now: try it again after After. Flow
// control's gates return it (a rate limit out of tokens, a quota full, a
// breaker open); a queue worker hands the task back for that long without
// counting the attempt; the HTTP API answers 503 with Retry-After. It is
// one type for every part (queue.DeferError and flow.DeferError name it),
// so errors.As finds it whichever package a caller knows.
type DeferError struct {
	Reason string
	After  time.Duration
}

// Error implements error.
func (e *DeferError) Error() string { return fmt.Sprintf("deferred for %s: %s", e.After, e.Reason) }

// Is matches ErrDeferred.
func (e *DeferError) Is(target error) bool { return target == ErrDeferred }
