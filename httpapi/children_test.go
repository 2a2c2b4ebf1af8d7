package httpapi_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// TestChildrenShownOverHTTP: a parent that waits for its children shows
// WAITING with waiting_for.children, and each child shows its parent and
// the step that spawned it.
func TestChildrenShownOverHTTP(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, "kids", queue.Config{}); err != nil { // no worker runs it
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: "wf"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			return nil, task.Spawn([]task.Child{{Queue: "kids", Type: "x"}, {Queue: "kids", Type: "x"}}, task.SpawnOptions{Wait: 1})
		}},
		task.Step{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: "boss", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	var r resp
	waitFor(t, "WAITING", func() bool {
		r = a.do("GET", "/v1/queues/wf/tasks/boss", nil)
		return r.str("current_status") == "WAITING"
	})
	wf, _ := r.JSON["waiting_for"].(map[string]any)
	ch, _ := wf["children"].(map[string]any)
	if ch == nil || ch["step"] != float64(1) || ch["n"] != float64(2) || ch["wait"] != float64(1) {
		t.Fatalf("waiting parent: %s", r.Raw)
	}
	k := a.do("GET", "/v1/queues/kids/tasks/boss.1.0", nil).want(t, 200)
	if k.str("parent") != "boss" || k.num("parent_step") != 1 {
		t.Fatalf("child: %s", k.Raw)
	}
}
