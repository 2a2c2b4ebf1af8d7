package budget

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Bounds of a scrape of the budgets' gauges (Collector).
const (
	// DefaultCollectBudgets is the most budgets a scrape reports, in key
	// order.
	DefaultCollectBudgets = 100
	// DefaultCollectTenants is the most tenants a scrape reports per
	// budget; the others are summed under OtherTenantsLabel.
	DefaultCollectTenants = 20
	// DefaultCollectTimeout bounds the etcd reads of one scrape.
	DefaultCollectTimeout = 5 * time.Second
	// OtherTenantsLabel is the tenant label of the tenants of a budget
	// beyond the most a scrape reports, summed.
	OtherTenantsLabel = "(other)"
)

// collectBatch is the most budgets read in one transaction: two reads
// each, within etcd's 128 operations.
const collectBatch = 60

// CollectorConfig bounds what a Collector reads and reports per scrape.
type CollectorConfig struct {
	// MaxBudgets is the most budgets reported, the first in key order
	// (default DefaultCollectBudgets); the rest are counted in
	// drover_budget_metrics_omitted.
	MaxBudgets int
	// MaxTenants is the most tenants reported per budget, those that
	// take the most (used, reserved and waiting tokens), default
	// DefaultCollectTenants; the rest are summed under OtherTenantsLabel.
	MaxTenants int
	// Timeout bounds the reads of one scrape (default
	// DefaultCollectTimeout).
	Timeout time.Duration
}

// Collector reports each budget of a namespace as gauges, read from etcd
// when scraped: the tokens used, reserved and remaining in the current
// window, the requests used, the live reservations, and the tenants
// waiting (refused and not admitted since), fleet-wide whoever reserved.
// Register it with the process's registry; see docs/budgets.md.
type Collector struct {
	c   *Client
	cfg CollectorConfig
}

var (
	descLimitTokens   = budgetDesc("drover_budget_limit_tokens", "Tokens an LLM budget allows per window (0: not limited).")
	descLimitRequests = budgetDesc("drover_budget_limit_requests", "Requests an LLM budget allows per window (0: not limited).")
	descUsed          = budgetDesc("drover_budget_used_tokens", "Tokens settled against an LLM budget in its current window, with the provider's correction, fleet-wide.")
	descReserved      = budgetDesc("drover_budget_reserved_tokens", "Estimates of an LLM budget's live reservations of its current window, fleet-wide.")
	descRemaining     = budgetDesc("drover_budget_remaining_tokens", "Tokens a reservation may still take in an LLM budget's current window (absent when tokens are not limited).")
	descRequests      = budgetDesc("drover_budget_used_requests", "Reservations made against an LLM budget in its current window (a block counts its requests).")
	descLive          = budgetDesc("drover_budget_live_reservations", "Unsettled reservations of an LLM budget.")
	descWaiting       = budgetDesc("drover_budget_waiting_tenants", "Tenants of an LLM budget whose last reservation, in this window or the last, was refused for the budget's total or their share, not admitted since.")
	descWaitingTokens = budgetDesc("drover_budget_waiting_tokens", "The refused estimates of an LLM budget's waiting tenants, summed.")
	descTenantUsed    = tenantDesc("drover_budget_tenant_used_tokens", "Tokens a tenant settled against an LLM budget in its current window.")
	descTenantRes     = tenantDesc("drover_budget_tenant_reserved_tokens", "Estimates of a tenant's live reservations of an LLM budget's current window.")
	descTenantWait    = tenantDesc("drover_budget_tenant_waiting_tokens", "The estimate a waiting tenant of an LLM budget was last refused (0: not waiting).")
	descOmitted       = prometheus.NewDesc("drover_budget_metrics_omitted", "Budgets of the namespace beyond the most a scrape reports, not reported.", nil, nil)
	descScrapeError   = prometheus.NewDesc("drover_budget_metrics_error", "Reading the budgets from etcd for this scrape failed.", nil, nil)
)

func budgetDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"budget"}, nil)
}

func tenantDesc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, []string{"budget", "tenant"}, nil)
}

// NewCollector returns a Collector of c's namespace, read through c (its
// clock places the windows; it reserves nothing, so it holds no lease).
func NewCollector(c *Client, cfg CollectorConfig) *Collector {
	if cfg.MaxBudgets <= 0 {
		cfg.MaxBudgets = DefaultCollectBudgets
	}
	if cfg.MaxTenants <= 0 {
		cfg.MaxTenants = DefaultCollectTenants
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultCollectTimeout
	}
	return &Collector{c: c, cfg: cfg}
}

// Describe sends the descriptors of every gauge.
func (m *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLimitTokens, descLimitRequests, descUsed, descReserved, descRemaining, descRequests,
		descLive, descWaiting, descWaitingTokens, descTenantUsed, descTenantRes, descTenantWait, descOmitted, descScrapeError} {
		ch <- d
	}
}

// Collect reads the budgets (at most MaxBudgets, within Timeout) and sends
// their gauges. A failed read sends an invalid metric with the error, which
// the registry reports; the other collectors are gathered all the same.
func (m *Collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.Timeout)
	defer cancel()
	views, omitted, err := m.c.readAll(ctx, m.cfg.MaxBudgets)
	if err != nil {
		ch <- prometheus.NewInvalidMetric(descScrapeError, err)
		return
	}
	ch <- prometheus.MustNewConstMetric(descOmitted, prometheus.GaugeValue, float64(omitted))
	now := m.c.now()
	for _, v := range views {
		m.collectOne(ch, v, now)
	}
}

// collectOne sends the gauges of one budget.
func (m *Collector) collectOne(ch chan<- prometheus.Metric, v view, now time.Time) {
	u := v.status(now)
	k := u.Key
	g := func(d *prometheus.Desc, x int64, labels ...string) {
		m, err := prometheus.NewConstMetric(d, prometheus.GaugeValue, float64(x), append([]string{k}, labels...)...)
		if err != nil { // a label it cannot serve: this series fails, not the process
			m = prometheus.NewInvalidMetric(d, err)
		}
		ch <- m
	}
	g(descLimitTokens, u.Tokens)
	g(descLimitRequests, u.Requests)
	g(descUsed, u.Used)
	g(descReserved, u.Reserved)
	if u.Remaining >= 0 {
		g(descRemaining, u.Remaining)
	}
	g(descRequests, u.RequestsUsed)
	g(descLive, int64(u.Live))
	wait := v.waiting(now)
	var waitTokens int64
	for _, e := range wait {
		waitTokens += e
	}
	g(descWaiting, int64(len(wait)))
	g(descWaitingTokens, waitTokens)
	for _, t := range topTenants(u.TenantUsage, wait, m.cfg.MaxTenants) {
		g(descTenantUsed, t.Used, t.Tenant)
		g(descTenantRes, t.Reserved, t.Tenant)
		g(descTenantWait, t.waiting, t.Tenant)
	}
}

// waiting returns the tenants of v waiting at now, with the estimate each
// was last refused: refused (for the budget's total or its fair share) in
// the current window or the last, and not admitted since.
func (v view) waiting(now time.Time) map[string]int64 {
	st := v.st
	st.Tenants = cloneTenants(st.Tenants)
	st.roll(v.cfg, now)
	out := map[string]int64{}
	for t, ts := range st.Tenants {
		if ts.Pending > 0 && ts.Seen >= st.Window-1 {
			out[t] = ts.Pending
		}
	}
	return out
}

// tenantRow is one tenant's gauges.
type tenantRow struct {
	TenantUsage
	waiting int64
}

// topTenants returns the n tenants that take the most (used, reserved and
// waiting tokens; ties by name), and the rest summed under
// OtherTenantsLabel, with a tenant of that name: one series each.
func topTenants(usage []TenantUsage, wait map[string]int64, n int) []tenantRow {
	rows := map[string]*tenantRow{}
	for _, u := range usage {
		rows[u.Tenant] = &tenantRow{TenantUsage: u}
	}
	for t, e := range wait {
		if rows[t] == nil {
			rows[t] = &tenantRow{TenantUsage: TenantUsage{Tenant: t}}
		}
		rows[t].waiting = e
	}
	rest, named := rows[OtherTenantsLabel], rows[OtherTenantsLabel] != nil
	delete(rows, OtherTenantsLabel)
	if rest == nil {
		rest = &tenantRow{TenantUsage: TenantUsage{Tenant: OtherTenantsLabel}}
	}
	weight := func(r *tenantRow) int64 { return r.Used + r.Reserved + r.waiting }
	names := slices.SortedFunc(maps.Keys(rows), func(a, b string) int {
		return cmp.Or(cmp.Compare(weight(rows[b]), weight(rows[a])), cmp.Compare(a, b))
	})
	out := make([]tenantRow, 0, min(len(names), n)+1)
	for i, t := range names {
		r := rows[t]
		if i < n {
			out = append(out, *r)
			continue
		}
		rest.Requests, rest.Used, rest.Reserved, rest.waiting = rest.Requests+r.Requests, rest.Used+r.Used, rest.Reserved+r.Reserved, rest.waiting+r.waiting
	}
	if named || len(names) > n {
		out = append(out, *rest)
	}
	return out
}

// readAll reads the first most budgets of the namespace in key order, with
// their counters and reservations, and says how many more there are: one
// read of the configurations, then one transaction per collectBatch
// budgets.
func (c *Client) readAll(ctx context.Context, most int) ([]view, int, error) {
	resp, err := c.cli.Get(ctx, c.keys.BudgetConfigs(), clientv3.WithPrefix(), clientv3.WithLimit(int64(most)))
	if err != nil {
		return nil, 0, fmt.Errorf("budget: collect: %w", err)
	}
	views := make([]view, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		key, ok := keyspace.BudgetOf(c.keys.BudgetConfigs(), string(kv.Key))
		if !ok || keyspace.CheckBudgetKey("key", key) != nil {
			continue // not a budget's: its label could not be served
		}
		v := view{}
		if err := json.Unmarshal(kv.Value, &v.cfg); err != nil {
			return nil, 0, fmt.Errorf("budget: %s has an unreadable configuration: %w", key, err)
		}
		v.cfg.Key = key
		views = append(views, v)
	}
	omitted := max(0, int(resp.Count)-len(resp.Kvs))
	for lo := 0; lo < len(views); lo += collectBatch {
		part := views[lo:min(lo+collectBatch, len(views))]
		ops := make([]clientv3.Op, 0, 2*len(part))
		for _, v := range part {
			ops = append(ops, clientv3.OpGet(c.keys.BudgetState(v.cfg.Key)),
				clientv3.OpGet(c.keys.BudgetReservations(v.cfg.Key), clientv3.WithPrefix()))
		}
		tr, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, 0, fmt.Errorf("budget: collect: %w", err)
		}
		for i := range part {
			if st := tr.Responses[2*i].GetResponseRange().Kvs; len(st) > 0 {
				if err := json.Unmarshal(st[0].Value, &part[i].st); err != nil {
					return nil, 0, fmt.Errorf("budget: %s has unreadable counters: %w", part[i].cfg.Key, err)
				}
			}
			part[i].res = parseReservations(tr.Responses[2*i+1].GetResponseRange().Kvs)
		}
	}
	return views, omitted, nil
}
