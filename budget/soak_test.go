package budget_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// soakCall is one simulated model call: reserved, in flight until end,
// then settled with actual.
type soakCall struct {
	c           *budget.Client
	r           budget.Reservation
	est, actual int64
	end         time.Time
	window      int // the window it was admitted in
}

// soakWindow is what one window's calls did.
type soakWindow struct {
	admitted, refused int
	byStart, byEnd    int64 // actual tokens of the calls admitted, and of those settled, in it
	largest, overrun  int64 // its largest call (actual), its largest actual - estimate
	inFlight          int   // the most calls in flight at once
	// late is the sum of the overruns (actual - estimate, when above 0)
	// of its calls in flight after its last second that admitted one:
	// the budget admitted on their estimates, so what they use beyond
	// them is what its calls can use beyond the budget.
	late int64
}

// soakSpan is the time simulated and the budget's tokens a minute:
// DROVER_BUDGET_SOAK and 100,000 (about 250 calls in flight), or by
// default 3m and 20,000 (about 50), which a race-detector run of the
// package on a loaded machine finishes in time.
func soakSpan(t *testing.T) (time.Duration, int64) {
	s := os.Getenv("DROVER_BUDGET_SOAK")
	if s == "" {
		return 3 * time.Minute, 20_000
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < time.Minute || d > 24*time.Hour {
		t.Fatalf("DROVER_BUDGET_SOAK=%q: must be a duration of 1m to 24h", s)
	}
	return d, 100_000
}

// TestSoakTwiceTheDemand holds a budget of 100,000 tokens a minute (20,000
// without DROVER_BUDGET_SOAK) at
// twice the demand it allows, through four clients (four worker
// processes), with reservations in flight: each call reserves its
// estimate, takes 1 to 30 simulated seconds, then settles with an actual
// usage differing randomly from the estimate by up to ±50 %. The calls of
// each simulated second reserve at once, and those that end settle at
// once, on eight goroutines. It counts, for every window, the tokens the
// calls admitted in it really used: each stays within 5 % of the budget,
// and above it by at most the overruns of the calls still in flight when
// the window last admitted one, and by at most the window's largest
// single call (checkSoak). The
// clock is the test's, moved a second at a time: DROVER_BUDGET_SOAK
// (default 3m) is the time simulated, 10m for the run; the etcd
// writes are real.
func TestSoakTwiceTheDemand(t *testing.T) {
	span, tokens := soakSpan(t)
	ctx := context.Background()
	clk := newFakeClock()
	const window = 60
	ns := etcdtest.Namespace(t)
	cs := make([]*budget.Client, 4)
	for i := range cs {
		cs[i] = budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
		t.Cleanup(func() { _ = cs[i].Close() })
	}
	if _, err := cs[0].Set(ctx, budget.Budget{Key: key, Tokens: tokens, WindowSeconds: window}); err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(41, 7))
	// Demand: twice the budget, in calls of 50 to 350 tokens estimated
	// (200 on average): 2 * 100,000 / 200 = 1,000 calls a minute.
	perSecond := 2 * float64(tokens) / 200 / window
	var owed float64
	windows := make([]soakWindow, int(span/(window*time.Second)))
	var flight []*soakCall
	for sec := range len(windows) * window {
		w := &windows[sec/window]
		now := clk.Now()
		var due []*soakCall
		keep := flight[:0]
		for _, c := range flight {
			if !c.end.After(now) {
				due = append(due, c)
			} else {
				keep = append(keep, c)
			}
		}
		flight = keep
		soakEach(t, due, func(c *soakCall) error { _, err := c.c.Settle(ctx, c.r, c.actual, nil); return err })
		for _, c := range due {
			w.byEnd += c.actual
		}
		var arrivals []*soakCall
		for owed += perSecond; owed >= 1; owed-- {
			est := int64(50 + rng.IntN(301))
			arrivals = append(arrivals, &soakCall{c: cs[len(arrivals)%len(cs)], est: est,
				actual: est/2 + rng.Int64N(est+1), end: now.Add(time.Duration(1+rng.IntN(30)) * time.Second)})
		}
		soakEach(t, arrivals, func(c *soakCall) error {
			r, err := c.c.Reserve(ctx, key, "acme", c.est)
			if errors.Is(err, drover.ErrDeferred) {
				return nil
			}
			c.r = r
			return err
		})
		admittedNow := false
		for _, c := range arrivals {
			if c.r.ID == "" {
				w.refused++
				continue
			}
			w.admitted++
			w.byStart += c.actual
			w.largest, w.overrun = max(w.largest, c.actual), max(w.overrun, c.actual-c.est)
			c.window = sec / window
			flight = append(flight, c)
			admittedNow = true
		}
		if admittedNow {
			w.late = 0
			for _, c := range flight {
				if c.window == sec/window {
					w.late += max(0, c.actual-c.est)
				}
			}
		}
		w.inFlight = max(w.inFlight, len(flight))
		clk.Add(time.Second)
	}
	checkSoak(t, windows, tokens)
}

// soakEach runs f on every call, on eight goroutines, and fails t on the
// first error.
func soakEach(t *testing.T, calls []*soakCall, f func(*soakCall) error) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, len(calls))
	next := make(chan *soakCall)
	for range 8 {
		wg.Go(func() {
			for c := range next {
				if err := f(c); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, c := range calls {
		next <- c
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// checkSoak logs every window and checks that the tokens its admitted
// calls used stay within 5 % of tokens, and above it by at most its
// largest single call, and by at most the overruns of its calls in flight
// after its last admission: the budget admits on estimates, so every call
// in flight then may use more than it holds; the margin the budget keeps
// back for them (learned from the settles) bounds their sum.
func checkSoak(t *testing.T, windows []soakWindow, tokens int64) {
	t.Helper()
	var admitted, refused, beyond int
	for i, w := range windows {
		admitted, refused = admitted+w.admitted, refused+w.refused
		above := w.byStart - tokens
		t.Logf("window %d: calls admitted %d, refused %d, at most %d in flight; tokens used by the calls admitted %d of %d (%.1f %%), by the calls settled %d (%.1f %%); largest call %d, largest overrun %d, overruns in flight after the last admission %d",
			i, w.admitted, w.refused, w.inFlight, w.byStart, tokens, 100*float64(w.byStart)/float64(tokens), w.byEnd, 100*float64(w.byEnd)/float64(tokens), w.largest, w.overrun, w.late)
		if above > w.largest {
			beyond++
			t.Errorf("window %d: %d tokens above the budget, more than its largest call (%d)", i, above, w.largest)
		}
		if w.byStart < tokens*95/100 || w.byStart > tokens*105/100 || above > w.late {
			t.Errorf("window %d: the calls admitted used %d tokens, want within 5 %% of %d and at most %d above it (the overruns in flight after its last admission)", i, w.byStart, tokens, w.late)
		}
	}
	t.Logf("%d of %d windows above the budget by more than their largest call", beyond, len(windows))
	if refused == 0 || admitted == 0 {
		t.Fatalf("%d admitted, %d refused: the demand did not exceed the budget", admitted, refused)
	}
}
