package fleet

import "time"

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
