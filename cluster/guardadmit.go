package cluster

import (
	"context"
	"time"
)

// kickGap is the least time between a check and one a reservation asks
// for (Admission's kicks): a flood of refused writes does not make the
// guard check back to back.
const kickGap = 100 * time.Millisecond

// wait waits for the next check: Interval, or a kick once kickGap has
// passed. It reports false when ctx ends.
func (g *Guard) wait(ctx context.Context, kicks <-chan struct{}) bool {
	next := g.cfg.After(g.cfg.Interval)
	var gap <-chan time.Time
	if kicks != nil {
		gap = g.cfg.After(min(kickGap, g.cfg.Interval))
	}
	kicked, gapOver := false, false
	for {
		select {
		case <-ctx.Done():
			return false
		case <-next:
			return true
		case <-kicks:
			if gapOver {
				return true
			}
			kicked = true
		case <-gap:
			if kicked {
				return true
			}
			gap, gapOver = nil, true
		}
	}
}
