package fleet_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// budgetClock is a clock the test moves by hand.
type budgetClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *budgetClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *budgetClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestBudgetGateDefersWithoutAnAttempt: tasks that name a budget reserve
// their estimated tokens before they run and settle what their handler
// reported; a task the window has no room for is deferred, its attempt not
// counted, and runs once the window turns.
func TestBudgetGateDefersWithoutAnAttempt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	clk := &budgetClock{now: time.Date(2026, 1, 2, 3, 4, 59, 0, time.UTC)} // a second before the window turns
	b := budget.New(cli, ns, budget.WithClock(clk.Now))
	defer b.Close()
	const key = "openai/gpt-4.1/key-prod"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 100, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)

	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	meta := queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: 40}
	tasks := []queue.Task{{ID: "a", Type: "chat", Metadata: meta}, {ID: "b", Type: "chat", Metadata: meta},
		{ID: "c", Type: "chat", Metadata: meta}, {ID: "plain", Type: "chat"}}
	if _, err := qc.Submit(ctx, "llm", tasks, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "llm", Concurrency: 1, Gates: []queue.Gate{gate}})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
		if task.Metadata.Budget != "" {
			gate.Used(task, 35) // each used 35 of the 40 it reserved
		}
		return nil, nil
	})
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(rctx) }()
	defer func() {
		stop()
		<-ran
		_ = w.Close(context.Background())
		_ = gate.Flush(context.Background()) // no settle outlives the test
	}()

	// Two of the three fit the window (35 + 35 settled, then 40 more would
	// make 110 of 100): the third, whichever it is, is deferred.
	var deferred string
	waitFor(t, func() bool {
		for _, id := range []string{"a", "b", "c"} {
			if task, err := qc.Get(ctx, id); err == nil && task.Deferrals > 0 {
				deferred = id
				return true
			}
		}
		return false
	}, "a task deferred")
	// The deferred task says it waits for the budget, and the metric
	// counts it (at least this deferral: other tests count too).
	waitFor(t, func() bool {
		task, err := qc.Get(ctx, deferred)
		w := budget.TaskWait(task)
		return err == nil && w != nil && w.Budget == key && w.Deferrals >= 1 && !w.Since.IsZero() && strings.Contains(w.Reason, "tokens of 100")
	}, "the deferred task's budget wait")
	if n := testutil.ToFloat64(metrics.BudgetTaskDeferrals.WithLabelValues(key)); n < 1 {
		t.Fatalf("drover_budget_task_deferrals_total{budget=%q} is %v, want at least 1", key, n)
	}
	// The settles are written after the tasks' outcomes, apart from them.
	var u budget.Usage
	waitFor(t, func() bool {
		u, err = b.Get(ctx, key)
		return err == nil && u.Used == 70 && u.Reserved == 0
	}, "the two tasks' settles")
	if u.RequestsUsed != 2 {
		t.Fatalf("after two tasks: %+v, want 70 used in 2 requests", u)
	}
	clk.Add(time.Second) // the window turns
	waitFor(t, func() bool {
		task, err := qc.Get(ctx, deferred)
		return err == nil && task.CurrentStatus == queue.Succeeded
	}, "the deferred task succeeded")
	task, _ := qc.Get(ctx, deferred)
	if w := budget.TaskWait(task); w != nil {
		t.Fatalf("the task that ran still waits for %+v", w)
	}
	if task.Attempt != 1 || task.RetriesAttempted != 0 {
		t.Fatalf("task %s: attempt %d, retries %d: the deferral spent an attempt", deferred, task.Attempt, task.RetriesAttempted)
	}
	waitFor(t, func() bool {
		u, err = b.Get(ctx, key)
		return err == nil && u.Used == 35 && u.Reserved == 0
	}, "the deferred task's settle in the next window")
	if u.RequestsUsed != 1 {
		t.Fatalf("the next window: %+v, want 35 used in one request", u)
	}
	waitFor(t, func() bool {
		p, err := qc.Get(ctx, "plain")
		return err == nil && p.CurrentStatus == queue.Succeeded
	}, "the task without a budget succeeded")
	// Every settle forgot its attempt, and Used for a task the gate never
	// admitted records nothing.
	gate.Used(&queue.Task{ID: "never-admitted", Token: 1, Attempt: 1}, 5)
	waitFor(t, func() bool { return gate.PendingUsed() == 0 }, "the gate forgot every settled attempt")
}

// waitFor polls cond until it holds, for at most a minute.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within a minute", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// refuseGate defers every task for an hour.
type refuseGate struct{}

func (refuseGate) Admit(context.Context, *queue.Task) (func(error), error) {
	return nil, &queue.DeferError{Reason: "refused by the caller's gate", After: time.Hour}
}

// TestBudgetGateAfterCallerGates: a fleet worker puts its budget gate after
// the caller's own gates, so a task they refuse reserves nothing and is
// charged no request.
func TestBudgetGateAfterCallerGates(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	b := budget.New(cli, ns)
	defer b.Close()
	const key = "openai/gpt-4.1/prod-key-name"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 3600}); err != nil {
		t.Fatal(err)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	meta := queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: 40}
	if _, err := qc.Submit(ctx, "llm", []queue.Task{{ID: "a", Type: "chat", Metadata: meta}}, nil); err != nil {
		t.Fatal(err)
	}
	cfg := fleet.Config{Worker: queue.WorkerConfig{Namespace: ns, Queue: "llm", TTL: 5 * time.Second, Gates: []queue.Gate{refuseGate{}}}, Handler: noop}
	w, err := fleet.NewWorker(ctx, cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(rctx) }()
	defer func() {
		stop()
		<-ran
		_ = w.Close(context.Background())
	}()
	waitFor(t, func() bool {
		task, err := qc.Get(ctx, "a")
		return err == nil && task.Deferrals > 0
	}, "the caller's gate deferred the task")
	if u, err := b.Get(ctx, key); err != nil || u.Used != 0 || u.RequestsUsed != 0 || u.Reserved != 0 {
		t.Fatalf("after the caller's gate refused: %+v %v, want nothing reserved or charged", u, err)
	}
}

// TestBudgetGateEstimateAboveCap: a task whose estimate exceeds its
// tenant's cap is deferred as one above the budget is, for the unwaitable
// delay rather than until the window turns, and holds nobody back.
func TestBudgetGateEstimateAboveCap(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := srv.Client(t)
	b := budget.New(cli, etcdtest.Namespace(t))
	defer b.Close()
	const key = "openai/gpt-4.1/key-prod"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400, Caps: map[string]int64{"capped": 100}}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	for _, est := range []int64{900, 5000} { // above the cap; above the budget
		task := &queue.Task{ID: "big", Type: "chat", Metadata: queue.Metadata{Tenant: "capped", Budget: key, EstimatedTokens: est}}
		_, err := gate.Admit(ctx, task)
		var de *queue.DeferError
		if !errors.As(err, &de) || de.After != 30*time.Second || !strings.Contains(de.Reason, "estimate") {
			t.Fatalf("estimate %d: %v, want a deferral of 30s naming the estimate", est, err)
		}
	}
	for i := range 5 {
		task := &queue.Task{ID: "small", Type: "chat", Attempt: i, Metadata: queue.Metadata{Tenant: "other", Budget: key, EstimatedTokens: 100}}
		done, err := gate.Admit(ctx, task)
		if err != nil {
			t.Fatalf("reservation %d of 5 of 100: %v", i+1, err)
		}
		done(nil)
	}
	if err := gate.Flush(ctx); err != nil { // no settle outlives the test
		t.Fatal(err)
	}
}
