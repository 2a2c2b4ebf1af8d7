package agentserver

import "time"

// SetStreamKeepalive sets how often a quiet SSE answer sends a comment,
// until the returned restore is called.
func SetStreamKeepalive(d time.Duration) (restore func()) {
	old := streamKeepalive
	streamKeepalive = d
	return func() { streamKeepalive = old }
}
