package budget_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
)

// TestSoakTwiceTheDemand holds a budget of 10,000 tokens a minute at
// twice the demand it allows, with each call's actual usage differing
// randomly from its estimate by up to ±50 %, and counts the tokens used in
// every window: each stays within 5 % of the budget, and never above it
// by more than the window's largest single overrun. The clock is the
// test's, moved a second at a time: DROVER_BUDGET_SOAK (default 3m) is
// the time simulated, 10m for the run; the etcd writes are real.
func TestSoakTwiceTheDemand(t *testing.T) {
	span := 3 * time.Minute
	if s := os.Getenv("DROVER_BUDGET_SOAK"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d < time.Minute || d > 24*time.Hour {
			t.Fatalf("DROVER_BUDGET_SOAK=%q: must be a duration of 1m to 24h", s)
		}
		span = d
	}
	ctx := context.Background()
	clk := newFakeClock()
	const tokens, window = 10_000, 60
	c := newBudget(t, budget.Budget{Tokens: tokens, WindowSeconds: window}, budget.WithClock(clk.Now))
	rng := rand.New(rand.NewPCG(41, 7))
	// Demand: twice the budget, in calls of 50 to 350 tokens estimated
	// (200 on average): 2 * 10,000 / 200 = 100 calls a minute.
	perSecond := 2 * float64(tokens) / 200 / window
	var owed float64
	windows := int(span / (window * time.Second))
	var refused, admitted int
	for w := range windows {
		var overrun int64 // the largest actual - estimate of this window
		for range window {
			owed += perSecond
			for ; owed >= 1; owed-- {
				est := int64(50 + rng.IntN(301))
				r, err := c.Reserve(ctx, key, "acme", est)
				if errors.Is(err, drover.ErrDeferred) {
					refused++
					continue
				}
				if err != nil {
					t.Fatal(err)
				}
				admitted++
				actual := est/2 + rng.Int64N(est+1) // ±50 %
				overrun = max(overrun, actual-est)
				if _, err := c.Settle(ctx, r, actual, nil); err != nil {
					t.Fatal(err)
				}
			}
			if s := status(t, c); s.WindowStart.Unix()/window != clk.Now().Unix()/window {
				t.Fatalf("window %d: counted in the window of %s", w, s.WindowStart)
			}
			clk.Add(time.Second)
			if clk.Now().Unix()%window == 0 {
				break
			}
		}
		clk.Add(-time.Second) // read the window that ends, then turn it
		used := status(t, c).Used
		clk.Add(time.Second)
		t.Logf("window %d: %d tokens used of %d (%.1f %%), largest overrun %d", w, used, tokens, 100*float64(used)/tokens, overrun)
		if used < tokens*95/100 || used > tokens+overrun {
			t.Errorf("window %d: %d tokens used, want within 5 %% of %d and at most %d above it", w, used, tokens, overrun)
		}
	}
	if refused == 0 || admitted == 0 {
		t.Fatalf("%d admitted, %d refused: the demand did not exceed the budget", admitted, refused)
	}
}
