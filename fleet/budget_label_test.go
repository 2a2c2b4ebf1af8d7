package fleet_test

import (
	"context"
	"errors"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBudgetGateUnconfiguredLabel: tasks that name budgets nobody
// configured are deferred and counted under the one label
// budget.UnconfiguredLabel, not a series per key they name; a configured
// budget's deferrals keep its key.
func TestBudgetGateUnconfiguredLabel(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	bc := budget.New(srv.Client(t), ns)
	defer bc.Close()
	g := fleet.NewBudgetGate(bc, func() clientv3.LeaseID { return 0 }, nil)
	counter := metrics.BudgetTaskDeferrals.WithLabelValues(budget.UnconfiguredLabel)
	before := testutil.ToFloat64(counter)
	keys := []string{"openai/gpt-4.1/key-nobody-" + ns, "anthropic/claude/key-nobody-" + ns}
	for i, k := range keys {
		task := &queue.Task{ID: "u" + string(rune('a'+i)), Type: "summarize", Metadata: queue.Metadata{Tenant: "acme", Budget: k, EstimatedTokens: 10}}
		_, err := g.Admit(ctx, task)
		var de *drover.DeferError
		if !errors.As(err, &de) || de.After == 0 {
			t.Fatalf("a task naming unconfigured %s: %v, want a deferral", k, err)
		}
	}
	if n := testutil.ToFloat64(counter) - before; n != 2 {
		t.Fatalf("deferrals under %q rose by %v, want 2", budget.UnconfiguredLabel, n)
	}
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "budget" && (l.GetValue() == keys[0] || l.GetValue() == keys[1]) {
					t.Fatalf("%s has a series for the unconfigured key %s", mf.GetName(), l.GetValue())
				}
			}
		}
	}
	if budget.CheckKey(budget.UnconfiguredLabel) == nil {
		t.Fatalf("%q is a usable budget key: the label could be a budget's", budget.UnconfiguredLabel)
	}
}
