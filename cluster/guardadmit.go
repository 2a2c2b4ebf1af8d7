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

// admit refreshes the Admission, if any, with what st measured (or
// forgets the member when nothing was), and notes in st.full whether the
// largest write it refused since the last check still does not fit.
func (g *Guard) admit(st *GuardStatus) {
	a := g.cfg.Admission
	if a == nil {
		return
	}
	if !st.measured || st.Quota <= 0 {
		a.Forget(g.cfg.Endpoint)
		return
	}
	a.Refresh(g.cfg.Endpoint, st.mark, st.Size, st.Quota, g.cfg.HighWater, g.cfg.LowWater, st.Full || st.Alarm)
	st.full = 0
	if st.refused > 0 {
		if usage, fits := a.Fits(st.refused); !fits {
			st.full = usage
		}
	}
}
