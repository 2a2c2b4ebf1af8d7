package budget

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"sync"
	"time"
)

// state is a budget's counters for its current window (the key
// budgets/state/{key}). Reserved tokens are not counted here: they are the
// estimates of the live reservation keys, so that a reservation whose lease
// ends stops counting without anybody writing.
type state struct {
	// Window is the current window's index: unix seconds / Len.
	Window int64 `json:"window"`
	// Len is the window length the index was computed with.
	Len      int64 `json:"len"`
	Requests int64 `json:"requests"`
	// Used is the tokens settled in this window.
	Used int64 `json:"used"`
	// Floor is the tokens the provider's headers said were gone beyond
	// drover's count, until FloorUntil (unix ms).
	Floor      int64 `json:"floor,omitempty"`
	FloorUntil int64 `json:"floor_until,omitempty"`
	// Tenants holds each tenant that asked in this window or the last.
	Tenants map[string]*tenantState `json:"tenants,omitempty"`
	// The error of the estimates, learned from the settles and kept over
	// window turns: ErrN settles counted (at most errSettles), the
	// running mean of (actual - estimate) / estimate and of its square.
	ErrN    int64   `json:"err_n,omitempty"`
	ErrMean float64 `json:"err_mean,omitempty"`
	ErrSq   float64 `json:"err_sq,omitempty"`
}

// tenantState is one tenant's counters in the current window.
type tenantState struct {
	Requests int64 `json:"requests"`
	Used     int64 `json:"used"`
	// Seen is the last window in which the tenant asked (admitted or not).
	Seen int64 `json:"seen"`
	// Pending is the estimate of the tenant's last refused reservation
	// (0: its last ask was admitted). It is kept over one window turn, as
	// the refused work comes back when the window turns.
	Pending int64 `json:"pending,omitempty"`
}

// windowOf returns the index of the window of length n seconds holding now.
func windowOf(now time.Time, n int64) int64 { return now.Unix() / n }

// maxSkewSeconds is how far, at least one window, the stored window may be
// ahead of a writer's clock for the writer to count in it.
const maxSkewSeconds = 300

// roll moves st to the window holding now: counters of an older window are
// dropped; tenants seen in the last window stay active. It never moves
// back, which would zero the counters of the window the other writers
// count in: a writer whose clock is behind the stored window by at most
// maxSkewSeconds (at least one window) counts in the stored window. One
// further behind also leaves st in the stored window, and roll reports it
// (skew): Reserve refuses with ErrClockSkew, Settle counts in the stored
// window, both warn.
func (st *state) roll(cfg Budget, now time.Time) (skew bool) {
	cur := windowOf(now, cfg.WindowSeconds)
	if st.Len == cfg.WindowSeconds && cur < st.Window {
		skew = st.Window > cur+max(1, (maxSkewSeconds+cfg.WindowSeconds-1)/cfg.WindowSeconds)
		cur = st.Window
	}
	if st.Window == cur && st.Len == cfg.WindowSeconds {
		if st.FloorUntil != 0 && now.UnixMilli() >= st.FloorUntil {
			st.Floor, st.FloorUntil = 0, 0
		}
		return skew
	}
	tenants := map[string]*tenantState{}
	for t, ts := range st.Tenants {
		if st.Len == cfg.WindowSeconds && ts.Seen >= cur-1 {
			tenants[t] = &tenantState{Seen: min(ts.Seen, cur), Pending: ts.Pending}
		}
	}
	*st = state{Window: cur, Len: cfg.WindowSeconds, Tenants: tenants, ErrN: st.ErrN, ErrMean: st.ErrMean, ErrSq: st.ErrSq}
	return skew
}

// errSettles is how many of the latest settles the learned error of the
// estimates averages over (an exponential average beyond them), and
// errWarm how many it takes before the margin is kept.
const (
	errSettles = 200
	errWarm    = 20
)

// marginSigmas is how many standard deviations of the calls in flight's
// summed error the margin keeps back beyond their expected overrun.
const marginSigmas = 2

// learn counts in the budget's error of estimates a settle of a
// reservation of est tokens whose call used actual.
func (st *state) learn(est, actual int64) {
	if est <= 0 {
		return
	}
	rel := min(max(float64(actual-est)/float64(est), -1), 4)
	st.ErrN = min(st.ErrN+1, errSettles)
	a := 1 / float64(st.ErrN)
	st.ErrMean += a * (rel - st.ErrMean)
	st.ErrSq += a * (rel*rel - st.ErrSq)
}

// margin is the tokens kept back for the calls of res in flight in the
// current window using more than they reserved: the budget admits on
// estimates, and what those calls use beyond theirs, once the window's
// last admission is made, is what the window's calls use beyond the
// budget. Their expected overrun is the learned mean error times their
// estimates (when the estimates run low), their spread marginSigmas
// standard deviations of the sum of their errors, the errors taken as
// independent: sqrt(var) * sqrt(sum of estimate²). 0 until errWarm
// settles were counted, or when estimates are exact.
func (st *state) margin(res []Reservation) int64 {
	if st.ErrN < errWarm {
		return 0
	}
	var sum, sq float64
	for _, r := range res {
		if r.Window == st.Window {
			e := float64(r.Estimate)
			sum, sq = sum+e, sq+e*e
		}
	}
	v := max(0, st.ErrSq-st.ErrMean*st.ErrMean)
	return int64(max(0, st.ErrMean)*sum + marginSigmas*math.Sqrt(v*sq))
}

// ErrClockSkew is returned by Reserve when the budget's counters are of a
// window far ahead of this process's clock: this clock, or the last
// writer's, is wrong.
var ErrClockSkew = errors.New("budget: clock skew")

// skewWarnEvery is the least time between two warnings of one budget's
// clock skew by one process.
const skewWarnEvery = time.Minute

var (
	skewMu     sync.Mutex
	skewWarned = map[string]time.Time{} // by budget key: when this process last warned
)

// skewError returns budget key's ErrClockSkew at now for counters of
// window w, and logs it at most once per skewWarnEvery per budget.
func skewError(key string, w, length int64, now time.Time) error {
	err := fmt.Errorf("%w: budget %s counts in the window starting %s, more than %ds ahead of this clock (%s); synchronise the clocks (NTP), or delete and set the budget again to start its counters over",
		ErrClockSkew, key, time.Unix(w*length, 0).UTC().Format(time.RFC3339), maxSkewSeconds, now.UTC().Format(time.RFC3339))
	skewMu.Lock()
	last, ok := skewWarned[key]
	warn := !ok || now.Sub(last) >= skewWarnEvery || now.Before(last)
	if warn {
		if len(skewWarned) >= 1000 {
			clear(skewWarned) // bounded: a process warning of that many budgets warns a little more often
		}
		skewWarned[key] = now
	}
	skewMu.Unlock()
	if warn {
		slog.Warn("budget: its counters are of a window far ahead of this clock; a writer's clock is wrong", "budget", key, "err", err)
	}
	return err
}

// tenant returns t's counters, created when absent.
func (st *state) tenant(t string) *tenantState {
	if st.Tenants == nil {
		st.Tenants = map[string]*tenantState{}
	}
	ts := st.Tenants[t]
	if ts == nil {
		ts = &tenantState{}
		st.Tenants[t] = ts
	}
	return ts
}

// tenantRoom refuses a tenant st does not track yet when it tracks
// MaxActiveTenants already.
func tenantRoom(st *state, tenant string) *refusal {
	if _, ok := st.Tenants[tenant]; ok || len(st.Tenants) < MaxActiveTenants {
		return nil
	}
	return &refusal{reason: fmt.Sprintf("%d tenants asked in this window or the last, the most a budget tracks; tenant %q waits for the window to turn", len(st.Tenants), tenant)}
}

// held sums the live reservations made in window w: in total and per
// tenant.
func held(res []Reservation, w int64) (int64, map[string]int64) {
	var total int64
	per := map[string]int64{}
	for _, r := range res {
		if r.Window == w {
			total += r.Estimate
			per[r.Tenant] += r.Estimate
		}
	}
	return total, per
}

// refusal says why a reservation was refused. pend: the refusal is of the
// budget's total or of the tenant's fair share, so the refused estimate is
// recorded as the tenant's Pending; a refusal of the requests per window or
// of the tenant's cap records nothing (its estimate waiting would only
// hold the other tenants back, and a cap refusal does not end by their
// leaving room).
type refusal struct {
	reason string
	pend   bool
}

// decide says whether tenant may reserve est tokens now, given the window's
// counters (already rolled) and the live reservations. It is the whole of
// the fairness rule:
//
//   - the requests and tokens of the window, and the tenant's cap, bound
//     every admission;
//   - each active tenant has a share of the tokens in proportion to its
//     weight. A tenant is active when it asked in this window, or asked in
//     the last one and still holds a reservation or was refused (its work
//     comes back);
//   - a tenant that took nothing in this window is admitted whenever the
//     budget's total allows, even when its estimate exceeds its share, so
//     that no tenant starves; what such a tenant was refused (pending) is
//     set aside from every other tenant's admissions until it is admitted;
//   - a tenant within its share is admitted; beyond it, only from what is
//     left after every other active tenant's unused share, or its pending
//     estimate when larger, is set aside.
func decide(cfg Budget, st *state, res []Reservation, tenant string, est int64) *refusal {
	if cfg.Requests > 0 && st.Requests+1 > cfg.Requests {
		return &refusal{reason: fmt.Sprintf("%d requests of %d used in this window", st.Requests, cfg.Requests)}
	}
	if cfg.Tokens == 0 {
		return nil
	}
	reserved, per := held(res, st.Window)
	taken := func(t string) int64 {
		if ts := st.Tenants[t]; ts != nil {
			return ts.Used + per[t]
		}
		return per[t]
	}
	total := st.Used + reserved + st.Floor
	margin := st.margin(res)
	if total+est+margin > cfg.Tokens {
		if margin > 0 {
			return &refusal{fmt.Sprintf("%d tokens of %d taken in this window and %d kept back for the calls in flight using more than their estimates", total, cfg.Tokens, margin), true}
		}
		return &refusal{fmt.Sprintf("%d tokens of %d taken in this window", total, cfg.Tokens), true}
	}
	total += margin // below, what is taken includes the margin
	mine := taken(tenant)
	if c, ok := cfg.Caps[tenant]; ok && mine+est > c {
		return &refusal{reason: fmt.Sprintf("tenant %q took %d tokens of its cap of %d in this window", tenant, mine, c)}
	}
	if mine == 0 {
		return nil
	}
	active := []string{tenant}
	var starving int64 // pending estimates of others that took nothing yet
	for t, ts := range st.Tenants {
		if t == tenant || ts.Seen < st.Window-1 {
			continue
		}
		if ts.Seen == st.Window || per[t] > 0 || ts.Pending > 0 {
			active = append(active, t)
		}
		if ts.Seen >= st.Window-1 && ts.Pending > 0 && taken(t) == 0 {
			starving += ts.Pending
		}
	}
	if total+est+starving > cfg.Tokens {
		return &refusal{fmt.Sprintf("%d tokens of %d taken in this window and %d set aside for tenants refused before taking any", total, cfg.Tokens, starving), true}
	}
	if len(active) == 1 {
		return nil
	}
	var sum float64
	for _, t := range active {
		sum += cfg.weight(t)
	}
	share := func(t string) int64 { return int64(float64(cfg.Tokens) * cfg.weight(t) / sum) }
	if mine+est <= share(tenant) {
		return nil
	}
	free := cfg.Tokens - total
	for _, t := range active[1:] {
		free -= max(0, share(t)-taken(t), st.Tenants[t].Pending)
	}
	if est <= free {
		return nil
	}
	return &refusal{fmt.Sprintf("tenant %q took %d tokens, its share is %d of %d while %d tenants ask", tenant, mine, share(tenant), cfg.Tokens, len(active)), true}
}

// view is a budget as one read found it.
type view struct {
	cfg   Budget
	st    state
	res   []Reservation
	cfgMR int64 // mod revisions, compared by the transaction that writes
	stMR  int64
}

// Usage is a budget's configuration with its usage in the current window.
type Usage struct {
	Budget
	// WindowStart is when the current window began.
	WindowStart time.Time `json:"window_start" doc:"When the current window began."`
	// RequestsUsed is the reservations made in this window.
	RequestsUsed int64 `json:"requests_used" doc:"Reservations made in this window."`
	// Used is the tokens settled in this window (with the provider's
	// correction).
	Used int64 `json:"used" doc:"Tokens settled in this window, with the provider's correction."`
	// Reserved is the estimates of live reservations of this window.
	Reserved int64 `json:"reserved" doc:"Estimates of the live reservations of this window."`
	// Remaining is what a reservation may still take (-1: tokens are not
	// limited).
	Remaining int64 `json:"remaining" doc:"Tokens a reservation may still take in this window (-1: tokens are not limited)."`
	// Live is the number of unsettled reservations.
	Live int `json:"live" doc:"Unsettled reservations."`
	// TenantUsage is each tenant's part of this window, by tenant.
	TenantUsage []TenantUsage `json:"tenant_usage" doc:"Each tenant's part of this window."`
}

// TenantUsage is one tenant's part of a budget's window.
type TenantUsage struct {
	Tenant   string `json:"tenant" doc:"The tenant (empty: work that named none)."`
	Requests int64  `json:"requests" doc:"Its reservations in this window."`
	Used     int64  `json:"used" doc:"Its tokens settled in this window."`
	Reserved int64  `json:"reserved" doc:"Its live reservations' estimates."`
}

// status is v's usage at now.
func (v view) status(now time.Time) Usage {
	st := v.st
	st.roll(v.cfg, now)
	reserved, per := held(v.res, st.Window)
	s := Usage{Budget: v.cfg, WindowStart: time.Unix(st.Window*st.Len, 0).UTC(), RequestsUsed: st.Requests,
		Used: st.Used + st.Floor, Reserved: reserved, Remaining: -1, Live: len(v.res), TenantUsage: []TenantUsage{}}
	if v.cfg.Tokens > 0 {
		s.Remaining = max(0, v.cfg.Tokens-s.Used-reserved)
	}
	names := map[string]bool{}
	for t, ts := range st.Tenants {
		if ts.Requests > 0 || ts.Used > 0 {
			names[t] = true
		}
	}
	for t := range per {
		names[t] = true
	}
	for _, t := range slices.Sorted(maps.Keys(names)) {
		u := TenantUsage{Tenant: t, Reserved: per[t]}
		if ts := st.Tenants[t]; ts != nil {
			u.Requests, u.Used = ts.Requests, ts.Used
		}
		s.TenantUsage = append(s.TenantUsage, u)
	}
	return s
}
