package budget_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"reflect"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

const key = "openai/gpt-4.1/key-prod"

// newBudget returns a client on a fresh namespace with budget key set to b.
// Its clock stands still in the middle of a window unless opts set one, so
// no window turns under a test that counts.
func newBudget(t *testing.T, b budget.Budget, opts ...budget.Option) *budget.Client {
	t.Helper()
	still := time.Date(2026, 11, 29, 12, 0, 30, 0, time.UTC)
	opts = append([]budget.Option{budget.WithClock(func() time.Time { return still })}, opts...)
	c := budget.New(srv.Client(t), etcdtest.Namespace(t), opts...)
	t.Cleanup(func() { _ = c.Close() })
	b.Key = key
	if _, err := c.Set(context.Background(), b); err != nil {
		t.Fatal(err)
	}
	return c
}

func status(t *testing.T, c *budget.Client) budget.Usage {
	t.Helper()
	s, err := c.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestReserveSettleAccounting: a reservation holds its estimate; a settle
// under it refunds the rest, one over it charges the difference.
func TestReserveSettleAccounting(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, Requests: 10, WindowSeconds: 60}, budget.WithClock(clk.Now))
	admitted0 := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(key, "admitted"))
	settled0 := testutil.ToFloat64(metrics.BudgetTokensSettled.WithLabelValues(key))

	r1, err := c.Reserve(ctx, key, "acme", 300)
	if err != nil {
		t.Fatal(err)
	}
	if s := status(t, c); s.Reserved != 300 || s.Used != 0 || s.Remaining != 700 || s.RequestsUsed != 1 || s.Live != 1 {
		t.Fatalf("after reserving 300: %+v", s)
	}
	set, err := c.Settle(ctx, r1, 200, nil)
	if err != nil {
		t.Fatal(err)
	}
	if set.Difference != -100 {
		t.Fatalf("settle 200 of 300: difference %d, want -100 (refund)", set.Difference)
	}
	if s := status(t, c); s.Reserved != 0 || s.Used != 200 || s.Remaining != 800 || s.Live != 0 {
		t.Fatalf("after settling 200: %+v", s)
	}
	r2, err := c.Reserve(ctx, key, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	if set, err = c.Settle(ctx, r2, 250, nil); err != nil || set.Difference != 150 {
		t.Fatalf("settle 250 of 100: %+v %v, want a charge of 150", set, err)
	}
	s := status(t, c)
	if s.Used != 450 || s.Remaining != 550 || s.RequestsUsed != 2 {
		t.Fatalf("after settling 250 of 100: %+v", s)
	}
	if want := []budget.TenantUsage{{Tenant: "acme", Requests: 2, Used: 450}}; !reflect.DeepEqual(s.TenantUsage, want) {
		t.Fatalf("tenant usage %+v, want %+v", s.TenantUsage, want)
	}
	// This process's metrics count the reservations and settled tokens.
	if n := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(key, "admitted")) - admitted0; n != 2 {
		t.Fatalf("admitted reservations counted %v, want 2", n)
	}
	if n := testutil.ToFloat64(metrics.BudgetTokensSettled.WithLabelValues(key)) - settled0; n != 450 {
		t.Fatalf("settled tokens counted %v, want 450", n)
	}
	// The window turns: its counters start again.
	clk.Add(time.Minute)
	if s := status(t, c); s.Used != 0 || s.RequestsUsed != 0 || s.Remaining != 1000 {
		t.Fatalf("next window: %+v", s)
	}
}

// TestRefusedIsDeferred: a reservation the window has no room for is a
// DeferError that lasts until the window turns; tokens and requests both
// bound it, and it is admitted once the window turns.
func TestRefusedIsDeferred(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	clk.Add(15 * time.Second) // 45s before the window turns
	c := newBudget(t, budget.Budget{Tokens: 100, Requests: 2, WindowSeconds: 60}, budget.WithClock(clk.Now))
	if _, err := c.Reserve(ctx, key, "", 80); err != nil {
		t.Fatal(err)
	}
	_, err := c.Reserve(ctx, key, "", 30)
	var d *drover.DeferError
	if !errors.As(err, &d) || d.After != 45*time.Second {
		t.Fatalf("30 more tokens of 100 with 80 held: %v, want a deferral of 45s", err)
	}
	if _, err := c.Reserve(ctx, key, "", 20); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, key, "", 0); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("a third request of 2: %v, want a deferral", err)
	}
	clk.Add(45 * time.Second)
	if _, err := c.Reserve(ctx, key, "", 30); err != nil {
		t.Fatalf("next window: %v", err)
	}
}

// TestSettleNotReserved: settling an unknown or already settled
// reservation is ErrNotReserved and changes nothing.
func TestSettleNotReserved(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60}, budget.WithClock(clk.Now))
	r, err := c.Reserve(ctx, key, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, r, 50, nil); err != nil {
		t.Fatal(err)
	}
	before := status(t, c)
	if _, err := c.Settle(ctx, r, 50, nil); !errors.Is(err, budget.ErrNotReserved) {
		t.Fatalf("second settle: %v, want ErrNotReserved", err)
	}
	unknown := r
	unknown.ID = "0123456789abcdef01234567"
	if _, err := c.Settle(ctx, unknown, 50, nil); !errors.Is(err, budget.ErrNotReserved) {
		t.Fatalf("unknown id: %v, want ErrNotReserved", err)
	}
	if after := status(t, c); !reflect.DeepEqual(before, after) {
		t.Fatalf("refused settles changed the budget:\n%+v\n%+v", before, after)
	}
}

// TestProviderHeadersLowerTheView: a settle whose provider headers say
// fewer tokens remain than drover counts lowers drover's remaining to the
// provider's until the provider's reset; headers that say more change
// nothing.
func TestProviderHeadersLowerTheView(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60}, budget.WithClock(clk.Now))
	r, _ := c.Reserve(ctx, key, "acme", 100)
	h := http.Header{}
	h.Set("x-ratelimit-remaining-tokens", "300")
	h.Set("x-ratelimit-reset-tokens", "10s")
	set, err := c.Settle(ctx, r, 100, h)
	if err != nil {
		t.Fatal(err)
	}
	if set.Corrected != 600 {
		t.Fatalf("corrected %d, want 600 (drover counted 900 left, the provider 300)", set.Corrected)
	}
	if s := status(t, c); s.Remaining != 300 {
		t.Fatalf("remaining %d after the provider said 300", s.Remaining)
	}
	var de *drover.DeferError
	if _, err := c.Reserve(ctx, key, "acme", 400); !errors.As(err, &de) || de.After > 10*time.Second {
		t.Fatalf("400 with 300 left: %v, want a deferral until the provider's reset in 10s", err)
	}
	r, _ = c.Reserve(ctx, key, "acme", 100)
	h.Set("x-ratelimit-remaining-tokens", "900")
	if set, err := c.Settle(ctx, r, 100, h); err != nil || set.Corrected != 0 {
		t.Fatalf("headers saying more remain: %+v %v, want no correction", set, err)
	}
	clk.Add(11 * time.Second) // past the provider's reset
	if s := status(t, c); s.Remaining != 800 {
		t.Fatalf("remaining %d after the provider's reset, want 800", s.Remaining)
	}
}

// TestBadInput: each bad input is an InputError naming its field, and
// nothing stored changes.
func TestBadInput(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60, Weights: map[string]float64{"a": 2}}, budget.WithClock(clk.Now))
	r, err := c.Reserve(ctx, key, "a", 100)
	if err != nil {
		t.Fatal(err)
	}
	before := status(t, c)
	badHeader := http.Header{"X-Ratelimit-Remaining-Tokens": {"lots"}}
	badReset := http.Header{"X-Ratelimit-Reset-Tokens": {"soon"}}
	for _, tc := range []struct {
		name, field string
		do          func() error
	}{
		{"negative estimate", "estimate", func() error { _, err := c.Reserve(ctx, key, "a", -1); return err }},
		{"absurd estimate", "estimate", func() error { _, err := c.Reserve(ctx, key, "a", 1e12); return err }},
		{"estimate above the budget", "estimate", func() error { _, err := c.Reserve(ctx, key, "a", 1001); return err }},
		{"bad key", "key", func() error { _, err := c.Reserve(ctx, key+"/", "a", 1); return err }},
		{"control character in tenant", "tenant", func() error { _, err := c.Reserve(ctx, key, "a\n", 1); return err }},
		{"ttl too long", "ttl", func() error { _, err := c.Reserve(ctx, key, "a", 1, budget.WithTTL(99999)); return err }},
		{"negative actual", "actual", func() error { _, err := c.Settle(ctx, r, -5, nil); return err }},
		{"actual over the bound", "actual", func() error { _, err := c.Settle(ctx, r, 1001, nil); return err }},
		{"bad remaining header", "headers x-ratelimit-remaining-tokens", func() error { _, err := c.Settle(ctx, r, 10, badHeader); return err }},
		{"bad reset header", "headers x-ratelimit-reset-tokens", func() error { _, err := c.Settle(ctx, r, 10, badReset); return err }},
		{"zero weight", "weights b", func() error {
			_, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 10, Weights: map[string]float64{"b": 0}})
			return err
		}},
		{"negative weight", "weights b", func() error {
			_, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 10, Weights: map[string]float64{"b": -1}})
			return err
		}},
		{"NaN weight", "weights b", func() error {
			_, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 10, Weights: map[string]float64{"b": math.NaN()}})
			return err
		}},
		{"cap above tokens", "caps b", func() error {
			_, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 10, Caps: map[string]int64{"b": 11}})
			return err
		}},
		{"no limit", "tokens", func() error { _, err := c.Set(ctx, budget.Budget{Key: key}); return err }},
		{"negative window", "window_seconds", func() error {
			_, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 10, WindowSeconds: -1})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.do()
			var in *drover.InputError
			if !errors.As(err, &in) || in.Field != tc.field {
				t.Fatalf("%v, want an InputError for %q", err, tc.field)
			}
		})
	}
	if after := status(t, c); !reflect.DeepEqual(before, after) {
		t.Fatalf("bad input changed the budget:\n%+v\n%+v", before, after)
	}
	if _, err := c.Reserve(ctx, "no/such/budget", "a", 1); !errors.Is(err, budget.ErrNoBudget) {
		t.Fatalf("unknown budget: %v, want ErrNoBudget", err)
	}
}

// TestSetListDelete: budgets are listed by key; a deleted one is gone with
// its reservations, and deleting it again is ErrNoBudget.
func TestSetListDelete(t *testing.T) {
	ctx := context.Background()
	c := newBudget(t, budget.Budget{Tokens: 1000})
	if _, err := c.Set(ctx, budget.Budget{Key: "anthropic/claude/key-a", Requests: 50, WindowSeconds: 1}); err != nil {
		t.Fatal(err)
	}
	list, err := c.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Key != "anthropic/claude/key-a" || list[1].Key != key || list[1].WindowSeconds != 60 || list[0].Remaining != -1 {
		t.Fatalf("list: %+v", list)
	}
	r, err := c.Reserve(ctx, key, "", 10)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, key); !errors.Is(err, budget.ErrNoBudget) {
		t.Fatalf("get after delete: %v", err)
	}
	if _, err := c.Settle(ctx, r, 10, nil); !errors.Is(err, budget.ErrNotReserved) {
		t.Fatalf("settle after delete: %v, want ErrNotReserved", err)
	}
	if err := c.Delete(ctx, key); !errors.Is(err, budget.ErrNoBudget) {
		t.Fatalf("second delete: %v, want ErrNoBudget", err)
	}
}

// TestClockBehind: a client whose clock is behind the window another
// client already counts in adds to that window instead of starting its
// own older one.
func TestClockBehind(t *testing.T) {
	ctx := context.Background()
	ahead, behind := newFakeClock(), newFakeClock()
	ahead.Add(time.Minute)
	ns := etcdtest.Namespace(t)
	c := budget.New(srv.Client(t), ns, budget.WithClock(ahead.Now))
	defer c.Close()
	late := budget.New(srv.Client(t), ns, budget.WithClock(behind.Now))
	defer late.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 100, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Reserve(ctx, key, "acme", 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, r, 60, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Reserve(ctx, key, "acme", 60); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("60 more from a clock a window behind: %v, want a deferral (60 of 100 used)", err)
	}
}

// TestClockBehindByWindows: a client whose clock is a few windows (within
// five minutes) behind the one counting counts in that window too, on
// reserve and on settle: its writes never zero the window's counters, so
// the budget stays enforced while both write in turn.
func TestClockBehindByWindows(t *testing.T) {
	ctx := context.Background()
	right, behind := newFakeClock(), newFakeClock()
	right.Add(3 * time.Minute)
	ns := etcdtest.Namespace(t)
	c := budget.New(srv.Client(t), ns, budget.WithClock(right.Now))
	defer c.Close()
	late := budget.New(srv.Client(t), ns, budget.WithClock(behind.Now))
	defer late.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 100, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	r, err := late.Reserve(ctx, key, "acme", 40)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := c.Reserve(ctx, key, "acme", 40) // the right clock rolls forward
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, r2, 40, nil); err != nil {
		t.Fatal(err)
	}
	r3, err := late.Reserve(ctx, key, "acme", 40)
	if err != nil {
		t.Fatalf("40 from the late clock with 40 of 100 used: %v", err)
	}
	if _, err := late.Settle(ctx, r3, 40, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := late.Settle(ctx, r, 40, nil); err != nil { // of an older window: nothing more to charge
		t.Fatal(err)
	}
	if s := status(t, c); s.Used != 80 || s.RequestsUsed != 2 {
		t.Fatalf("after the late clock wrote: %+v, want 80 used by 2 requests", s)
	}
	for _, cl := range []*budget.Client{late, c} {
		if _, err := cl.Reserve(ctx, key, "acme", 40); !errors.Is(err, drover.ErrDeferred) {
			t.Fatalf("40 more with 80 of 100 used: %v, want a deferral", err)
		}
	}
}

// TestClockFarBehind: a client whose clock is more than five minutes
// behind the window counted in (or counters written by a clock that far
// ahead) is refused with ErrClockSkew, and the counters stay: stepping
// back would zero them for every other writer.
func TestClockFarBehind(t *testing.T) {
	ctx := context.Background()
	wrong, right := newFakeClock(), newFakeClock()
	wrong.Add(24 * time.Hour)
	ns := etcdtest.Namespace(t)
	c := budget.New(srv.Client(t), ns, budget.WithClock(wrong.Now))
	defer c.Close()
	ok := budget.New(srv.Client(t), ns, budget.WithClock(right.Now))
	defer ok.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 100, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	r, err := c.Reserve(ctx, key, "acme", 100)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, r, 100, nil); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := ok.Reserve(ctx, key, "acme", 60); !errors.Is(err, budget.ErrClockSkew) {
			t.Fatalf("60 from a clock a day behind the counters: %v, want ErrClockSkew", err)
		}
	}
	if _, err := c.Reserve(ctx, key, "acme", 1); !errors.Is(err, drover.ErrDeferred) {
		t.Fatalf("1 more from the clock that used all 100: %v, want a deferral (the counters stay)", err)
	}
	if err := c.Delete(ctx, key); err != nil {
		t.Fatal(err)
	}
	if _, err := ok.Set(ctx, budget.Budget{Key: key, Tokens: 100, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	if _, err := ok.Reserve(ctx, key, "acme", 60); err != nil {
		t.Fatalf("60 after the budget was deleted and set again: %v", err)
	}
}

// TestReserveAfterClose: a closed client reserves nothing, whether under
// its session, a lease of the caller's or one of its own.
func TestReserveAfterClose(t *testing.T) {
	ctx := context.Background()
	cli := srv.Client(t)
	c := newBudget(t, budget.Budget{Tokens: 100})
	l, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, opts := range map[string][]budget.ReserveOption{"session": nil, "WithLease": {budget.WithLease(l.ID)}, "WithTTL": {budget.WithTTL(30)}} {
		if _, err := c.Reserve(ctx, key, "acme", 10, opts...); err == nil {
			t.Errorf("%s: a closed client reserved", name)
		}
	}
	if u := status(t, c); u.Live != 0 || u.RequestsUsed != 0 {
		t.Fatalf("after reserves through a closed client: %+v", u)
	}
}

// TestSettleAcrossWindowTurn: a reservation of the last window, which the
// client's cached view dropped when the window turned, still settles,
// charging only what it used beyond its estimate.
func TestSettleAcrossWindowTurn(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := newBudget(t, budget.Budget{Tokens: 100, WindowSeconds: 60}, budget.WithClock(clk.Now))
	old, err := c.Reserve(ctx, key, "acme", 30)
	if err != nil {
		t.Fatal(err)
	}
	clk.Add(time.Minute)
	if _, err := c.Reserve(ctx, key, "acme", 10); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Settle(ctx, old, 50, nil); err != nil {
		t.Fatalf("settle of the last window's reservation: %v", err)
	}
	if u := status(t, c); u.Used != 20 || u.Reserved != 10 || u.Live != 1 {
		t.Fatalf("after the settle: %+v, want 20 used (50 - 30), 10 reserved, 1 live", u)
	}
}

// TestEstimateAboveCap: an estimate above the tenant's cap could never be
// admitted: an InputError naming the estimate, nothing recorded, so that
// another tenant's second and later reservations are not held back.
func TestEstimateAboveCap(t *testing.T) {
	ctx := context.Background()
	c := newBudget(t, budget.Budget{Tokens: 1000, WindowSeconds: 60, Caps: map[string]int64{"capped": 100}})
	for range 2 {
		_, err := c.Reserve(ctx, key, "capped", 900)
		var in *drover.InputError
		if !errors.As(err, &in) || in.Field != "estimate" {
			t.Fatalf("900 against a cap of 100: %v, want an InputError on estimate", err)
		}
	}
	for i := range 5 {
		if _, err := c.Reserve(ctx, key, "other", 100); err != nil {
			t.Fatalf("reservation %d of 5 of 100: %v", i+1, err)
		}
	}
}

// TestRefusalsWriteOnlyWhenPendingGrows: a tenant whose deferred tasks of
// different estimates are refused again and again rewrites the budget's
// state only on its first ask of the window and when its pending estimate
// grows, not on every refusal.
func TestRefusalsWriteOnlyWhenPendingGrows(t *testing.T) {
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	c := budget.New(cli, ns, budget.WithClock(newFakeClock().Now))
	defer c.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Reserve(ctx, key, "big", 1000); err != nil {
		t.Fatal(err)
	}
	stateKey := keyspace.MustNew(ns).BudgetState(key)
	version := func() int64 {
		t.Helper()
		g, err := cli.Get(ctx, stateKey)
		if err != nil || len(g.Kvs) != 1 {
			t.Fatalf("read the state: %v %v", g, err)
		}
		return g.Kvs[0].Version
	}
	v0 := version()
	for i, est := range []int64{300, 200, 300, 250, 100, 400, 300} {
		var de *drover.DeferError
		if _, err := c.Reserve(ctx, key, "acme", est); !errors.As(err, &de) {
			t.Fatalf("ask %d (%d): %v, want deferred", i, est, err)
		}
	}
	if n := version() - v0; n != 2 {
		t.Fatalf("seven refusals wrote the state %d times, want 2 (the first ask, the pending estimate growing to 400)", n)
	}
}
