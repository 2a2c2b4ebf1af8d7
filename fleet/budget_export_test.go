package fleet

// SetBeforeSettle makes g run f before it sends each settle (after the
// handler returned): a test holds the settle there.
func SetBeforeSettle(g *BudgetGate, f func()) { g.beforeSettle = f }
