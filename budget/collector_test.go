package budget_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/prometheus/client_golang/prometheus"
)

// scrape gathers reg and returns each drover_budget_ gauge's value by
// name{label values}.
func scrape(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetValue())
			}
			out[mf.GetName()+"{"+strings.Join(ls, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return out
}

// checkScrape fails t for every series of want whose value got differs.
func checkScrape(t *testing.T, got, want map[string]float64) {
	t.Helper()
	var bad []string
	for k, v := range want {
		if g, ok := got[k]; !ok || g != v {
			bad = append(bad, fmt.Sprintf("%s = %v (present %v), want %v", k, g, ok, v))
		}
	}
	sort.Strings(bad)
	if len(bad) > 0 {
		t.Fatalf("scrape:\n%s\ngot %v", strings.Join(bad, "\n"), got)
	}
}

// TestCollectorReportsEachBudget scrapes a real registry against etcd
// after reserves, a settle and a refusal: used, reserved, remaining,
// requests, live reservations and the waiting tenant of the budget, and
// each tenant's part; then the budgets and tenants beyond the bounds, and
// the window's turn.
func TestCollectorReportsEachBudget(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	c := budget.New(srv.Client(t), etcdtest.Namespace(t), budget.WithClock(clk.Now))
	t.Cleanup(func() { _ = c.Close() })
	const key = "openai/gpt-4.1/key-prod"
	for _, k := range []string{key, "openai/gpt-4.1/key-zzz"} {
		if _, err := c.Set(ctx, budget.Budget{Key: k, Tokens: 1000, Requests: 50, WindowSeconds: 60}); err != nil {
			t.Fatal(err)
		}
	}
	r1 := reserve(t, c, key, "acme", 300)
	if _, err := c.Settle(ctx, r1, 250, nil); err != nil {
		t.Fatal(err)
	}
	reserve(t, c, key, "acme", 200)
	reserve(t, c, key, "globex", 400)
	var d *drover.DeferError
	if _, err := c.Reserve(ctx, key, "globex", 300); !errors.As(err, &d) {
		t.Fatalf("reserve of 300 with 150 left: %v, want a deferral", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(budget.NewCollector(c, budget.CollectorConfig{}))
	b := "{" + key
	checkScrape(t, scrape(t, reg), map[string]float64{
		"drover_budget_limit_tokens" + b + "}": 1000, "drover_budget_limit_requests" + b + "}": 50,
		"drover_budget_used_tokens" + b + "}": 250, "drover_budget_reserved_tokens" + b + "}": 600,
		"drover_budget_remaining_tokens" + b + "}": 150, "drover_budget_used_requests" + b + "}": 3,
		"drover_budget_live_reservations" + b + "}": 2, "drover_budget_waiting_tenants" + b + "}": 1,
		"drover_budget_waiting_tokens" + b + "}": 300, "drover_budget_metrics_omitted{}": 0,
		"drover_budget_tenant_used_tokens" + b + ",acme}": 250, "drover_budget_tenant_reserved_tokens" + b + ",acme}": 200,
		"drover_budget_tenant_waiting_tokens" + b + ",acme}": 0, "drover_budget_tenant_used_tokens" + b + ",globex}": 0,
		"drover_budget_tenant_reserved_tokens" + b + ",globex}": 400, "drover_budget_tenant_waiting_tokens" + b + ",globex}": 300,
		"drover_budget_used_tokens{openai/gpt-4.1/key-zzz}": 0, "drover_budget_remaining_tokens{openai/gpt-4.1/key-zzz}": 1000,
	})

	// One budget, one tenant: the second budget is omitted, acme (450
	// tokens against globex's 700) is summed as the others.
	small := prometheus.NewRegistry()
	small.MustRegister(budget.NewCollector(c, budget.CollectorConfig{MaxBudgets: 1, MaxTenants: 1}))
	got := scrape(t, small)
	checkScrape(t, got, map[string]float64{
		"drover_budget_metrics_omitted{}": 1, "drover_budget_used_tokens" + b + "}": 250,
		"drover_budget_tenant_reserved_tokens" + b + ",globex}": 400, "drover_budget_tenant_used_tokens" + b + ",(other)}": 250,
		"drover_budget_tenant_reserved_tokens" + b + ",(other)}": 200,
	})
	if _, ok := got["drover_budget_used_tokens{openai/gpt-4.1/key-zzz}"]; ok {
		t.Fatal("the budget beyond MaxBudgets was reported")
	}
	if _, ok := got["drover_budget_tenant_used_tokens"+b+",acme}"]; ok {
		t.Fatal("the tenant beyond MaxTenants was reported on its own")
	}

	// The window turns: nothing used or reserved in the new one; globex,
	// refused in the last, still waits.
	clk.Add(time.Minute)
	checkScrape(t, scrape(t, reg), map[string]float64{
		"drover_budget_used_tokens" + b + "}": 0, "drover_budget_reserved_tokens" + b + "}": 0,
		"drover_budget_used_requests" + b + "}": 0, "drover_budget_remaining_tokens" + b + "}": 1000,
		"drover_budget_waiting_tenants" + b + "}": 1, "drover_budget_tenant_waiting_tokens" + b + ",globex}": 300,
	})
	clk.Add(time.Minute)
	checkScrape(t, scrape(t, reg), map[string]float64{"drover_budget_waiting_tenants" + b + "}": 0, "drover_budget_waiting_tokens" + b + "}": 0})
}

// reserve reserves est tokens of key for tenant, failing t on an error.
func reserve(t *testing.T, c *budget.Client, key, tenant string, est int64) budget.Reservation {
	t.Helper()
	r, err := c.Reserve(context.Background(), key, tenant, est)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestCollectorFailsAlone scrapes through a closed etcd client: the
// collector's error is the gather's, and the registry's other metrics are
// gathered all the same.
func TestCollectorFailsAlone(t *testing.T) {
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	_ = cli.Close()
	c := budget.New(cli, etcdtest.Namespace(t))
	reg := prometheus.NewRegistry()
	other := prometheus.NewGauge(prometheus.GaugeOpts{Name: "other", Help: "another metric"})
	other.Set(7)
	reg.MustRegister(budget.NewCollector(c, budget.CollectorConfig{Timeout: time.Second}), other)
	mfs, err := reg.Gather()
	if err == nil || !strings.Contains(err.Error(), "budget: collect") {
		t.Fatalf("gather: %v, want the collector's error", err)
	}
	if len(mfs) != 1 || mfs[0].GetName() != "other" {
		t.Fatalf("gathered %v, want the other metric", mfs)
	}
}

// TestCollectorTenantNamedOther: a tenant named "(other)" shares the
// series of the tenants beyond MaxTenants, summed with them, rather than
// making a second series of the same labels, which the registry refuses
// (the others' sum dropped, the scrape failed).
func TestCollectorTenantNamedOther(t *testing.T) {
	ctx := context.Background()
	c := budget.New(srv.Client(t), etcdtest.Namespace(t), budget.WithClock(newFakeClock().Now))
	t.Cleanup(func() { _ = c.Close() })
	const key = "openai/gpt-4.1/key-other"
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 100_000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	reserve(t, c, key, "big", 1000)
	reserve(t, c, key, budget.OtherTenantsLabel, 500)
	reserve(t, c, key, "acme", 100)
	reserve(t, c, key, "globex", 50)
	// The tenant named "(other)" is always summed there, never ranked.
	for most, other := range map[int]float64{1: 650, 2: 550, 20: 500} {
		reg := prometheus.NewRegistry()
		reg.MustRegister(budget.NewCollector(c, budget.CollectorConfig{MaxTenants: most}))
		b := "{" + key + ","
		want := map[string]float64{"drover_budget_tenant_reserved_tokens" + b + "big}": 1000,
			"drover_budget_tenant_reserved_tokens" + b + "(other)}": other}
		if most > 1 {
			want["drover_budget_tenant_reserved_tokens"+b+"acme}"] = 100
		}
		checkScrape(t, scrape(t, reg), want)
	}
}

// TestCollectorSkipsForeignKeys: a key under the configurations' prefix
// that no budget can have written (its key is not valid UTF-8, which no
// label may hold) is skipped; the scrape neither fails nor panics.
func TestCollectorSkipsForeignKeys(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	c := budget.New(cli, ns, budget.WithClock(newFakeClock().Now))
	t.Cleanup(func() { _ = c.Close() })
	const key = "openai/gpt-4.1/key-fine"
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	ks, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, ks.BudgetConfigs()+"%FF", `{"tokens":10,"window_seconds":60}`); err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(budget.NewCollector(c, budget.CollectorConfig{}))
	checkScrape(t, scrape(t, reg), map[string]float64{"drover_budget_limit_tokens{" + key + "}": 1000})
}
