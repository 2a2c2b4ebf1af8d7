package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestTasksGetShowsBudgetWait: drover tasks get says that a task a budget
// gate deferred waits for its budget, and since when; --json has it as
// budget_wait.
func TestTasksGetShowsBudgetWait(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()
	const key = "openai/gpt-4.1/key-wait"
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 10, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	// 20 of a budget of 10: deferred for 30 s at a time.
	if _, err := qc.Submit(ctx, "llm", []queue.Task{{ID: "big", Type: "chat", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 20}}}, nil); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "llm", Concurrency: 1,
		Gates: []queue.Gate{fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)}})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(rctx) }()
	for i := 0; ; i++ {
		if task, err := qc.Get(ctx, "big"); err == nil && budget.TaskWait(task) != nil {
			break
		}
		if i == 600 {
			t.Fatal("the task was not deferred for its budget after 600 polls")
		}
		time.Sleep(100 * time.Millisecond)
	}
	stop()
	<-ran
	_ = w.Close(context.Background())
	r := drover(t, append(etcdFlags(ns), "tasks", "get", "big")...)
	if r.code != 0 || !strings.Contains(r.stdout, "waits for:") || !strings.Contains(r.stdout, "budget "+key+", since ") {
		t.Fatalf("tasks get: exit %d %q %q, want a line saying it waits for %s", r.code, r.stdout, r.stderr, key)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "big", "--json")...)
	var v struct {
		BudgetWait *budget.Wait `json:"budget_wait"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.BudgetWait == nil || v.BudgetWait.Budget != key || v.BudgetWait.Since.IsZero() {
		t.Fatalf("tasks get --json: %q %v, want budget_wait naming %s", r.stdout, err, key)
	}
}
