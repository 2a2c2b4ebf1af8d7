package schedule

import (
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
)

// TestLatestFiresOnceOverTheLongestWindow: latest over a cron of every
// minute, with the longest window and jitter, fires one tick at one
// instant (a scan that stopped short fired a day-old tick, then another).
func TestLatestFiresOnceOverTheLongestWindow(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 30, 0, time.UTC)
	s := Schedule{Name: "m", Cron: "* * * * *", Queue: "q", Type: "t", Catchup: Latest,
		CatchupWindow: queue.Duration(MaxCatchupWindow), Jitter: queue.Duration(50 * time.Second)}.withDefaults()
	for _, jitter := range []time.Duration{0, 50 * time.Second, MaxJitter} {
		s.Jitter = queue.Duration(jitter)
		tm, _ := s.timing()
		p := decide(s, tm, now.Add(-10*24*time.Hour), false, now)
		fires := 0
		if !p.fire.IsZero() {
			fires++
		}
		for nominal, i := p.next, 0; i < 5; i++ {
			if nominal.Add(jitterOf(s.Name, nominal, jitter)).After(now) {
				break
			}
			p = decide(s, tm, nominal, false, now)
			if !p.fire.IsZero() {
				fires++
			}
			nominal = p.next
		}
		if fires != 1 {
			t.Fatalf("jitter %s: latest fired %d ticks at one instant (last %s, %s before now)", jitter, fires, p.fire, now.Sub(p.fire))
		}
	}
}

// TestAllFiresAtMostMaxCatchup: all over the longest window and jitter
// fires MaxCatchup ticks at most, in order.
func TestAllFiresAtMostMaxCatchup(t *testing.T) {
	now := time.Date(2026, 11, 28, 12, 0, 30, 0, time.UTC)
	s := Schedule{Name: "m", Cron: "* * * * *", Queue: "q", Type: "t", Catchup: All,
		CatchupWindow: queue.Duration(MaxCatchupWindow), Jitter: queue.Duration(MaxJitter)}.withDefaults()
	tm, _ := s.timing()
	nominal, fires := now.Add(-10*24*time.Hour), 0
	var last time.Time
	for i := 0; i < 3*MaxCatchup; i++ {
		p := decide(s, tm, nominal, false, now)
		if p.fire.IsZero() {
			break
		}
		if !p.fire.After(last) {
			t.Fatalf("fire %d at %s, not after %s", fires, p.fire, last)
		}
		fires, last, nominal = fires+1, p.fire, p.next
	}
	if fires == 0 || fires > MaxCatchup {
		t.Fatalf("all fired %d ticks, want 1 to %d", fires, MaxCatchup)
	}
}
