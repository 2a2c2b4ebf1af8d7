package fleet

import (
	"context"
	"time"
)

// SetBeforeSettle makes g run f before it sends each settle (after the
// handler returned): a test holds the settle there.
func SetBeforeSettle(g *BudgetGate, f func()) { g.beforeSettle = f }

// SetFlushTimeout sets how long a Worker's Run and Close wait for the
// budget settles, and returns what undoes it.
func SetFlushTimeout(d time.Duration) func() {
	old := flushTimeout
	flushTimeout = d
	return func() { flushTimeout = old }
}

// SetClock makes g read the time from now and start its timers with
// after instead of time.Now and time.AfterFunc.
func SetClock(g *BudgetGate, now func() time.Time, after func(time.Duration, func())) {
	g.now, g.afterFunc = now, after
}

// WaitBackground waits for g's block reserves and settles in flight,
// without closing its blocks as Flush does.
func WaitBackground(ctx context.Context, g *BudgetGate) error { return g.settling.wait(ctx) }
