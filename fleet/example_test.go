package fleet_test

import (
	"context"
	"fmt"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/queue"
)

// Running a worker from Go: tasks of two tenants, at most one running at
// once per tenant and at most 100 a second in all, until the queue is
// drained.
func ExampleRunWorker() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	ns := fmt.Sprintf("example-%d", time.Now().UnixNano())
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		fmt.Println(err)
		return
	}
	tasks := []queue.Task{
		{ID: "summarize-1", Type: "summarize", Metadata: queue.Metadata{Tenant: "acme"}},
		{ID: "summarize-2", Type: "summarize", Metadata: queue.Metadata{Tenant: "globex"}},
	}
	if _, err := c.Submit(ctx, "emails", tasks, nil); err != nil {
		fmt.Println(err)
		return
	}

	spec, err := flow.ParseSpec([]string{"llm=100/s"}, []string{"tenant=1"}, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	err = fleet.RunWorker(ctx, cli, fleet.Config{
		Worker: queue.WorkerConfig{Namespace: ns, Queue: "emails", Concurrency: 4, Drain: true},
		Flow:   spec,
		Handler: func(ctx context.Context, t *queue.Task) ([]byte, error) {
			return []byte("a summary for " + t.Metadata.Tenant), nil
		},
	})
	fmt.Println("run:", err)
	for _, t := range tasks {
		done, _ := c.Wait(ctx, t.ID)
		fmt.Printf("%s: %s, %q\n", done.ID, done.CurrentStatus, done.Result)
	}
	// Output:
	// run: <nil>
	// summarize-1: SUCCEEDED, "a summary for acme"
	// summarize-2: SUCCEEDED, "a summary for globex"
}
