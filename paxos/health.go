package paxos

import (
	"errors"
	"fmt"
)

// ErrHalted matches (with errors.Is) the Health of a node whose run loop
// halted on a storage failure: it takes no further part in the group
// until it is restarted. It matches ErrStopped as well.
var ErrHalted = errors.New("paxos: node halted")

// errNotStarted is the Health of a node before Start.
var errNotStarted = fmt.Errorf("%w: not started", ErrStopped)

// Health reports whether the node takes part in its group: nil while its
// run loop runs (as a follower, candidate, leader, or removed member); an
// error matching ErrStopped before Start and once Stop was called or the
// Start context ended; and one matching ErrHalted too when the loop
// halted because its durable state could not be written, which only a
// restart cures. Status still answers then, with the last view the loop
// had: Health is what a liveness probe needs.
func (n *Node) Health() error {
	n.mu.Lock()
	started, stopped := n.started, n.stopped
	n.mu.Unlock()
	if !started {
		if stopped {
			return ErrStopped
		}
		return errNotStarted
	}
	select {
	case <-n.done:
		// exitErr and stopErr are written before done is closed.
		if n.stopErr != nil && n.exitErr == n.stopErr {
			return fmt.Errorf("%w: %w: its durable state could not be written (%v); restart it",
				ErrStopped, ErrHalted, n.stopErr)
		}
		return n.stoppedErr()
	default:
	}
	if stopped {
		return fmt.Errorf("%w: stopping", ErrStopped)
	}
	return nil
}
