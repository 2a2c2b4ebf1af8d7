package fleet_test

import (
	"context"
	"fmt"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/queue"
)

// fakeModel stands for an LLM provider: it answers a prompt and says how
// many tokens the call used.
func fakeModel(_ context.Context, prompt string) (answer string, tokens int64) {
	return "a summary of " + prompt, int64(100 + 10*len(prompt))
}

// A worker whose tasks spend an LLM budget: each reserves its estimate
// before it runs and settles what the (fake) model says it used.
func ExampleBudgetGate() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-budget-%d", time.Now().UnixNano())
	const key = "openai/gpt-4.1/key-prod"
	b := budget.New(cli, ns)
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 30000, WindowSeconds: 86400}); err != nil {
		fmt.Println(err)
		return
	}
	c, _ := queue.NewClient(cli, ns)
	meta := queue.Metadata{Tenant: "acme", Budget: key, EstimatedTokens: 500}
	tasks := []queue.Task{{ID: "s-1", Type: "summarize", Parameters: []byte(`"mail one"`), Metadata: meta},
		{ID: "s-2", Type: "summarize", Parameters: []byte(`"mail two"`), Metadata: meta}}
	if _, err := c.Submit(ctx, "llm", tasks, nil); err != nil {
		fmt.Println(err)
		return
	}

	var w *fleet.Worker
	w, err = fleet.NewWorker(ctx, cli, fleet.Config{
		Worker: queue.WorkerConfig{Namespace: ns, Queue: "llm", Drain: true},
		Handler: func(ctx context.Context, t *queue.Task) ([]byte, error) {
			answer, used := fakeModel(ctx, string(t.Parameters))
			w.Budgets().Used(t, used) // settled when the handler returns
			return []byte(answer), nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("run:", w.Run(ctx))
	_ = w.Close(ctx)
	u, _ := b.Get(ctx, key)
	fmt.Println("requests:", u.RequestsUsed, "used:", u.Used, "reserved:", u.Reserved, "remaining:", u.Remaining)
	// Output:
	// run: <nil>
	// requests: 2 used: 400 reserved: 0 remaining: 29600
}
