package budget

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// ask runs one reservation of est for tenant at now through roll and
// decide, as Reserve does, settling an admission at once for est.
func ask(cfg Budget, st *state, now time.Time, tenant string, est int64) bool {
	st.roll(cfg, now)
	ts := st.tenant(tenant)
	ts.Seen = st.Window
	if no := decide(cfg, st, nil, tenant, est); no != nil {
		if no.pend {
			ts.Pending = max(ts.Pending, est)
		}
		return false
	}
	st.Requests++
	st.Used += est
	ts.Requests++
	ts.Used += est
	ts.Pending = 0
	return true
}

// TestDecideEstimateAboveShare: a light tenant (weight 1 of 10, a share of
// 100 of 1000 tokens) whose calls estimate 150 asks after the heavy one
// took its share: refused once, its estimate is set aside from the next
// window on, so that it is admitted in every later window instead of
// starving.
func TestDecideEstimateAboveShare(t *testing.T) {
	cfg := Budget{Tokens: 1000, WindowSeconds: 60, Weights: map[string]float64{"light": 1, "heavy": 9}}
	var st state
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	for w := range 5 {
		light := 0
		for i := range 60 { // heavy first, then both, bounded
			if i >= 20 && i%2 == 0 && ask(cfg, &st, now, "light", 150) {
				light++
			} else if i < 20 || i%2 == 1 {
				ask(cfg, &st, now, "heavy", 50)
			}
		}
		if w > 0 && light == 0 {
			t.Fatalf("window %d: the light tenant starved (heavy used %d)", w, st.Tenants["heavy"].Used)
		}
		if st.Used < 950 {
			t.Fatalf("window %d: %d of 1000 tokens used", w, st.Used)
		}
		now = now.Add(time.Minute)
	}
}

// TestDecideIdleLastWindowTenant: a tenant that asked only in the last
// window, holds nothing and was not refused has no share set aside: a
// tenant alone now takes the whole budget.
func TestDecideIdleLastWindowTenant(t *testing.T) {
	cfg := Budget{Tokens: 100, WindowSeconds: 60}
	var st state
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	if !ask(cfg, &st, now, "gone", 10) {
		t.Fatal("first ask refused")
	}
	now = now.Add(time.Minute)
	for i := range 10 {
		if !ask(cfg, &st, now, "acme", 10) {
			t.Fatalf("ask %d of 10 refused: the idle tenant's share is still set aside (%+v)", i, st)
		}
	}
}

// TestTenantRoom: a budget tracking MaxActiveTenants tenants refuses a new
// one, with a reason naming the limit, and keeps admitting the tracked
// ones; the state stays far below etcd's 1.5 MiB value limit.
func TestTenantRoom(t *testing.T) {
	cfg := Budget{Tokens: MaxTokens, WindowSeconds: 60}
	var st state
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	long := strings.Repeat("t", MaxTenantLen-5)
	for i := range MaxActiveTenants {
		name := fmt.Sprintf("%s%05d", long, i)
		if no := tenantRoom(&st, name); no != nil {
			t.Fatalf("tenant %d of %d refused: %s", i, MaxActiveTenants, no.reason)
		}
		if !ask(cfg, &st, now, name, MaxTokens/MaxActiveTenants/2) {
			t.Fatalf("tenant %d refused", i)
		}
	}
	no := tenantRoom(&st, "one-more")
	if no == nil || !strings.Contains(no.reason, "the most a budget tracks") {
		t.Fatalf("tenant %d: %v, want a refusal naming the limit", MaxActiveTenants+1, no)
	}
	if no := tenantRoom(&st, long+"00007"); no != nil {
		t.Fatalf("a tracked tenant refused: %s", no.reason)
	}
	b, _ := json.Marshal(st)
	if len(b) > 512<<10 {
		t.Fatalf("the state of %d tenants is %d bytes", MaxActiveTenants, len(b))
	}
}

// TestDecideCapRefusalSetsNothingAside: a tenant refused on its cap (an
// estimate of 900 against a cap of 100, within the budget's 1000) or on
// the requests per window records no pending estimate, so that the other
// tenants' later reservations are not limited by it, window after window.
func TestDecideCapRefusalSetsNothingAside(t *testing.T) {
	cfg := Budget{Tokens: 1000, Requests: 50, WindowSeconds: 60, Caps: map[string]int64{"capped": 100}}
	var st state
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	for w := range 3 {
		if ask(cfg, &st, now, "capped", 900) {
			t.Fatalf("window %d: 900 admitted against a cap of 100", w)
		}
		if p := st.Tenants["capped"].Pending; p != 0 {
			t.Fatalf("window %d: a cap refusal set %d aside", w, p)
		}
		for i := range 5 {
			if !ask(cfg, &st, now, "other", 100) {
				t.Fatalf("window %d: reservation %d of 5 of 100 refused (%+v)", w, i+1, *st.Tenants["capped"])
			}
		}
		now = now.Add(time.Minute)
	}
	cfg = Budget{Tokens: 1000, Requests: 1, WindowSeconds: 60}
	st = state{}
	ask(cfg, &st, now, "first", 10)
	if ask(cfg, &st, now, "late", 500) || st.Tenants["late"].Pending != 0 {
		t.Fatalf("a requests refusal: %+v, want refused with nothing set aside", *st.Tenants["late"])
	}
}

// TestSkewWarningRateLimited: a clock skew is logged at most once a
// minute per budget, however often it is met.
func TestSkewWarningRateLimited(t *testing.T) {
	var mu sync.Mutex
	var logged bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(lockedWriter{&mu, &logged}, nil)))
	defer slog.SetDefault(prev)
	now := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	const k = "test/skew/warned"
	for i := range 10 { // ten refusals within 45 s, then one a minute after the first
		if err := skewError(k, 1, 60, now.Add(time.Duration(i)*5*time.Second)); !errors.Is(err, ErrClockSkew) {
			t.Fatalf("skewError: %v", err)
		}
	}
	_ = skewError(k, 1, 60, now.Add(time.Minute))
	mu.Lock()
	n := strings.Count(logged.String(), "budget="+k+" ")
	mu.Unlock()
	if n != 2 {
		t.Fatalf("eleven skews over a minute logged %d times, want 2:\n%s", n, logged.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestDecideKeepsMarginForCallsInFlight: once settles have shown the
// estimates to be off by ±50 %, the budget keeps back, for the calls in
// flight, their expected overrun plus two standard deviations of their
// summed error: an estimate that fits beside 100 calls of 200 in flight
// is refused while their error is uncertain, and admitted when the
// settles showed the estimates exact, or when no call is in flight (a
// lone reservation never waits for the margin).
func TestDecideKeepsMarginForCallsInFlight(t *testing.T) {
	cfg := Budget{Key: "k", Tokens: 24_000, WindowSeconds: 60}
	now := time.Unix(6000, 0)
	inFlight := func(w int64) []Reservation {
		res := make([]Reservation, 100)
		for i := range res {
			res[i] = Reservation{ID: fmt.Sprint(i), Tenant: "a", Estimate: 200, Window: w}
		}
		return res
	}
	exact, spread := &state{}, &state{}
	exact.roll(cfg, now)
	spread.roll(cfg, now)
	for i := range errSettles {
		exact.learn(200, 200)
		spread.learn(200, 100+int64(i%201)) // -50 % to +50 %, evenly
	}
	// 20,000 held: 4,000 left. sd of one call's error ≈ 0.29 × 200, of
	// 100 calls' sum ≈ 580, so the margin is about 1,160.
	if m := spread.margin(inFlight(spread.Window)); m < 1000 || m > 1300 {
		t.Fatalf("margin for 100 calls of 200 at ±50 %%: %d, want about 1,160", m)
	}
	if no := decide(cfg, spread, inFlight(spread.Window), "a", 3500); no == nil || !strings.Contains(no.reason, "kept back") {
		t.Errorf("3,500 beside 20,000 in flight at ±50 %%: %v, want refused for the margin", no)
	}
	if no := decide(cfg, spread, inFlight(spread.Window), "a", 2500); no != nil {
		t.Errorf("2,500 beside 20,000 in flight at ±50 %%: refused (%s), want admitted", no.reason)
	}
	if no := decide(cfg, exact, inFlight(exact.Window), "a", 3500); no != nil {
		t.Errorf("3,500 beside 20,000 in flight with exact estimates: refused (%s), want admitted", no.reason)
	}
	if no := decide(cfg, spread, inFlight(spread.Window-1), "a", 24_000); no != nil {
		t.Errorf("the whole budget with only the last window's calls in flight: refused (%s), want admitted", no.reason)
	}
	// The learned error outlives the window turn.
	spread.roll(cfg, now.Add(time.Minute))
	if spread.ErrN != errSettles || spread.margin(inFlight(spread.Window)) < 1000 {
		t.Errorf("after the window turned: %d settles learned, margin %d", spread.ErrN, spread.margin(inFlight(spread.Window)))
	}
}
