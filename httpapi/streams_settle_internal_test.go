package httpapi

import "time"

// A follower of a task that ended without a done ends within a second
// in these tests, not after the server's 15 s checks.
func init() {
	streamEndedCheck.Store(int64(50 * time.Millisecond))
	streamEndSettle.Store(int64(300 * time.Millisecond))
}

// SetStreamEnds sets how often a follower of a task ended without a done
// checks it, and how long it waits for a late done, until the returned
// func restores them. A test that calls it must not run in parallel.
func SetStreamEnds(every, settle time.Duration) (restore func()) {
	e, s := streamEndedCheck.Swap(int64(every)), streamEndSettle.Swap(int64(settle))
	return func() { streamEndedCheck.Store(e); streamEndSettle.Store(s) }
}
