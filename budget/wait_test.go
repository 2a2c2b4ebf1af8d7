package budget_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// deferForBudget submits task "big" to queue llm of ns, estimating more
// than budget key allows per window, and runs a worker with a budget gate
// until the gate deferred it (for 30 s: it stays PENDING, waiting).
func deferForBudget(t *testing.T, ns string) {
	t.Helper()
	ctx := context.Background()
	cli := srv.Client(t)
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 10, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Submit(ctx, "llm", []queue.Task{{ID: "big", Type: "chat", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 20}}}, nil); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "llm", Concurrency: 1, Gates: []queue.Gate{gate}})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(rctx) }()
	defer func() {
		stop()
		<-ran
		_ = w.Close(context.Background())
	}()
	for i := 0; ; i++ {
		if task, err := qc.Get(ctx, "big"); err == nil && budget.TaskWait(task) != nil {
			return
		}
		if i == 600 {
			task, err := qc.Get(ctx, "big")
			t.Fatalf("the task was not deferred for its budget after 600 polls: %+v %v", task, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestHTTPTaskShowsBudgetWait: the HTTP task view of a task a budget gate
// deferred names the budget and since when it waits.
func TestHTTPTaskShowsBudgetWait(t *testing.T) {
	ns := etcdtest.Namespace(t)
	base := serveNS(t, ns)
	deferForBudget(t, ns)
	code, _, out := call(t, http.MethodGet, base+"/v1/queues/llm/tasks/big", nil)
	w, _ := out["budget_wait"].(map[string]any)
	if code != 200 || w == nil || w["budget"] != key || w["since"] == nil || w["deferrals"].(float64) < 1 {
		t.Fatalf("task view: %d %v, want budget_wait naming %s", code, out, key)
	}
}

// TestTaskWaitOnlyForBudgets: a task deferred by another gate, or not
// deferred, waits for no budget.
func TestTaskWaitOnlyForBudgets(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	mk := func(reason string, deferrals int) *queue.Task {
		return &queue.Task{CurrentStatus: queue.Pending, Deferrals: deferrals, Metadata: queue.Metadata{Budget: key},
			Transitions: []queue.Transition{{Status: queue.Pending, At: at, Error: "deferred: " + reason}}}
	}
	if w := budget.TaskWait(mk(budget.WaitReason(key, "900 tokens of 1000 taken"), 3)); w == nil || w.Budget != key || !w.Since.Equal(at) || w.Deferrals != 3 {
		t.Fatalf("a budget's deferral: %+v", w)
	}
	for name, task := range map[string]*queue.Task{
		"a quota's deferral": mk("quota q full", 1),
		"no deferral now":    mk(budget.WaitReason(key, "x"), 0),
		"another budget":     mk(budget.WaitReason("a/b", "x"), 1),
	} {
		if w := budget.TaskWait(task); w != nil {
			t.Errorf("%s: %+v, want no budget wait", name, w)
		}
	}
}
