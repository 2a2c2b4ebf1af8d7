package httpapi

import "time"

// A follower of a task that ended without a done ends within a second
// in these tests, not after the server's 15 s checks.
func init() {
	streamEndedCheck.Store(int64(50 * time.Millisecond))
	streamEndSettle.Store(int64(300 * time.Millisecond))
}
