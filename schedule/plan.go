package schedule

import "time"

// plan is what the move of a schedule's due item does: fire tick fire
// (zero: none) and wait for tick next.
type plan struct {
	fire, next time.Time
}

// maxScan bounds the ticks of a cron schedule one plan reads: the minutes
// of the longest catch-up window and the longest jitter, which a plan
// reads back over, for the most frequent cron. A shorter scan would stop
// before the latest tick that passed.
const maxScan = int((MaxCatchupWindow+MaxJitter)/time.Minute) + 1

// decide plans the move at now of s's due item for tick nominal. A held
// item fires its tick. Otherwise the ticks that have passed (their fire
// time, jitter included, is not after now) from nominal on are missed but
// the latest, and the catch-up policy picks among those within the window
// (OnTime for None): All fires the first (of the last MaxCatchup) and
// waits for the one after it; Latest and None fire the latest and wait
// for the first tick after now.
func decide(s Schedule, tm timing, nominal time.Time, hold bool, now time.Time) plan {
	if hold {
		return plan{fire: nominal, next: tm.next(later(now, nominal))}
	}
	window := time.Duration(s.CatchupWindow)
	if s.Catchup == None {
		window = min(window, OnTime)
	}
	jitter := time.Duration(s.Jitter)
	at := func(t time.Time) time.Time { return t.Add(jitterOf(s.Name, t, jitter)) }
	from := nominal
	if earliest := now.Add(-window - jitter); from.Before(earliest) {
		from = tm.next(earliest.Add(-time.Nanosecond)) // the first tick from earliest on
	}
	var first, last time.Time // the eligible ticks that passed
	var n int
	if e, ok := tm.(every); ok {
		d := time.Duration(e)
		last = e.next(now).Add(-d) // the last tick at or before now
		if at(last).After(now) {
			last = last.Add(-d)
		}
		if !last.Before(from) {
			first, n = from, int(last.Sub(from)/d)+1
			if n > MaxCatchup {
				first = last.Add(-time.Duration(MaxCatchup-1) * d)
			}
		}
	} else {
		var ring []time.Time
		for t, i := from, 0; !at(t).After(now) && i < maxScan; t, i = tm.next(t), i+1 {
			ring = append(ring, t)
			if len(ring) >= 2*MaxCatchup {
				ring = append(ring[:0], ring[MaxCatchup:]...)
			}
		}
		if len(ring) > MaxCatchup {
			ring = ring[len(ring)-MaxCatchup:]
		}
		if len(ring) > 0 {
			first, last, n = ring[0], ring[len(ring)-1], len(ring)
		}
	}
	switch {
	case n == 0:
		return plan{next: from} // due later (its jitter), or to come
	case s.Catchup == All:
		return plan{fire: first, next: tm.next(first)}
	default:
		return plan{fire: last, next: tm.next(last)}
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// missed returns the ticks plan p passes over without firing them, from
// tick nominal on: those before the tick it fires (before the one it
// waits for when it fires none), or, for a held tick, those after it
// before the next. n counts them (at most maxScan of a cron); first and
// last are the first and the last.
func (p plan) missed(tm timing, nominal time.Time, hold bool) (n int, first, last time.Time) {
	from, to := nominal, p.next
	switch {
	case hold:
		from = tm.next(nominal)
	case !p.fire.IsZero():
		to = p.fire
	}
	if !from.Before(to) {
		return 0, time.Time{}, time.Time{}
	}
	if e, ok := tm.(every); ok {
		d := time.Duration(e)
		n = int((to.Sub(from) + d - 1) / d)
		return n, from, from.Add(time.Duration(n-1) * d)
	}
	for t := from; t.Before(to) && n < maxScan; t = tm.next(t) {
		n, last = n+1, t
	}
	return n, from, last
}
