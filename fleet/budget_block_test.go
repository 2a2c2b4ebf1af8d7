package fleet_test

import (
	"time"

	"context"
	"fmt"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runBlockTasks runs n tasks of tenant "acme" estimating est through a
// budget gate on budget key (limits tokens and requests), each handler
// reporting used tokens, and returns the budget after the gate's Flush
// and the reservations the gate made. The budget's default estimate for
// the tasks' type is 10 (est 0: the tasks take it).
func runBlockTasks(t *testing.T, key string, tokens, requests int64, n int, est, used int64) (budget.Usage, float64) {
	t.Helper()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: tokens, Requests: requests, WindowSeconds: 86400,
		Estimates: map[string]int64{"chat": 10}}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	// The gate's clock stands still: a block's age and a learned
	// default's life do not run out however slowly a loaded machine
	// runs the tasks, so the reservations counted are decisions, not
	// speed (budget_block_clock_test.go moves a clock by hand).
	start := time.Now()
	fleet.SetClock(gate, func() time.Time { return start }, func(d time.Duration, f func()) { time.AfterFunc(d, f) })
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	tasks := make([]queue.Task, n)
	for i := range tasks {
		tasks[i] = queue.Task{ID: fmt.Sprintf("t%03d", i), Type: "chat", Metadata: queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: est}}
	}
	if _, err := qc.Submit(ctx, "llm", tasks, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "llm", Concurrency: 4, Drain: true, Gates: []queue.Gate{gate}})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(_ context.Context, task *queue.Task) ([]byte, error) {
		gate.Used(task, used)
		return nil, nil
	})
	admitted := testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(key, "admitted"))
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if err := gate.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_ = w.Close(ctx)
	if st := w.Stats(); st.Succeeded != int64(n) {
		t.Fatalf("succeeded %d of %d", st.Succeeded, n)
	}
	u, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	return u, testutil.ToFloat64(metrics.BudgetReservations.WithLabelValues(key, "admitted")) - admitted
}

// TestBudgetGateReservesAhead: while the budget has ample room, the gate
// reserves blocks of many tasks' estimates and admits tasks from them
// without a reservation each; once drained, the budget counts exactly
// the tokens the handlers reported and one request per task (the blocks'
// unused requests given back), with nothing left reserved.
func TestBudgetGateReservesAhead(t *testing.T) {
	t.Parallel()
	const key, n = "openai/gpt-4.1/key-ahead", 200
	u, made := runBlockTasks(t, key, 1_000_000, 100_000, n, 10, 7)
	if made > n/4 {
		t.Errorf("%v reservations for %d tasks with ample room, want far fewer (blocks)", made, n)
	}
	if u.Used != 7*n || u.RequestsUsed != n || u.Reserved != 0 || u.Live != 0 {
		t.Errorf("after %d tasks of 7 tokens: used %d, requests %d, reserved %d, live %d; want %d, %d, 0, 0", n, u.Used, u.RequestsUsed, u.Reserved, u.Live, 7*n, n)
	}
}

// TestBudgetGateReservesAheadForDefaults: tasks without
// estimated_tokens, which take their type's default estimate, are
// admitted from blocks too once a reservation found the default: fewer
// reservations than tasks, the budget exact after the drain.
func TestBudgetGateReservesAheadForDefaults(t *testing.T) {
	t.Parallel()
	const key, n = "openai/gpt-4.1/key-ahead-default", 200
	u, made := runBlockTasks(t, key, 1_000_000, 100_000, n, 0, 7)
	if made > n/4 {
		t.Errorf("%v reservations for %d tasks taking their default with ample room, want far fewer (blocks)", made, n)
	}
	if u.Used != 7*n || u.RequestsUsed != n || u.Reserved != 0 || u.Live != 0 {
		t.Errorf("after %d tasks of 7 tokens: used %d, requests %d, reserved %d, live %d; want %d, %d, 0, 0", n, u.Used, u.RequestsUsed, u.Reserved, u.Live, 7*n, n)
	}
}

// TestBudgetGateNoBlocksNearTheLimit: with less room than blockRoom
// blocks, the gate reserves task by task: as many reservations as tasks.
func TestBudgetGateNoBlocksNearTheLimit(t *testing.T) {
	t.Parallel()
	const key, n = "openai/gpt-4.1/key-tight", 40
	u, made := runBlockTasks(t, key, 2000, 1000, n, 10, 7)
	if made != n || u.Used != 7*n || u.RequestsUsed != n || u.Live != 0 {
		t.Errorf("near the limit: %v reservations, used %d, requests %d, live %d; want %d, %d, %d, 0", made, u.Used, u.RequestsUsed, u.Live, n, 7*n, n)
	}
}
