package agentserver

import "time"

// SetStreamKeepalive sets how often a quiet SSE answer sends a comment,
// until the returned restore is called.
func SetStreamKeepalive(d time.Duration) (restore func()) {
	old := streamKeepalive
	streamKeepalive = d
	return func() { streamKeepalive = old }
}

// SetStoreScanLimit sets how many keys one store search or namespace
// listing examines, until the returned restore is called.
func SetStoreScanLimit(n int) (restore func()) {
	old := maxStoreScan
	maxStoreScan = n
	return func() { maxStoreScan = old }
}
