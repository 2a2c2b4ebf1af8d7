// Package childviewtest runs parents that spawn children, for the tests of
// the readers of children: package childview, the HTTP API, the CLI.
package childviewtest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Start runs, until the test ends, a worker of queue wf in namespace ns
// whose step tasks spawn kids in their first step (waiting for every one,
// collecting every outcome) and end in their second. Queue kids is
// configured; no worker runs it. It returns a queue client of ns.
func Start(t testing.TB, cli *clientv3.Client, ns string, kids []task.Child) *queue.Client {
	t.Helper()
	ctx := context.Background()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, "kids", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf"})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			return nil, task.Spawn(kids, task.SpawnOptions{Collect: true})
		}},
		task.Step{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran; _ = w.Close(context.Background()) })
	return c
}

// Kids returns n children of queue kids, of type search, each with
// parameters params (none when nil).
func Kids(n int, params json.RawMessage) []task.Child {
	kids := make([]task.Child, n)
	for i := range kids {
		kids[i] = task.Child{Queue: "kids", Type: "search", Parameters: params}
	}
	return kids
}

// Parent submits task id to queue wf and waits, up to wait, until it
// waits for its children.
func Parent(t testing.TB, c *queue.Client, id string, wait time.Duration) {
	t.Helper()
	ctx := context.Background()
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: id, Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(wait, func() bool {
		b, err := c.Get(ctx, id)
		return err == nil && b.CurrentStatus == queue.Waiting
	}) {
		t.Fatalf("parent %s does not wait for its children", id)
	}
}
