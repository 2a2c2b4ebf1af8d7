package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// drover tasks get shows a parent's children (counts by state, a page
// with each child's state, the command for the next page) and a child's
// parent with its queue; --json carries the same; a bad --children is a
// usage error.
func TestTasksGetShowsFamily(t *testing.T) {
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, "kids", queue.Config{}); err != nil { // no worker runs it
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			return nil, task.Spawn([]task.Child{{Queue: "kids", Type: "s"}, {Queue: "kids", Type: "s"}, {Queue: "kids", Type: "s"}}, task.SpawnOptions{Collect: true})
		}},
		task.Step{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: "boss", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(30*time.Second, func() bool {
		b, err := c.Get(ctx, "boss")
		return err == nil && b.CurrentStatus == queue.Waiting
	}) {
		t.Fatal("the parent does not wait for its children")
	}
	if _, err := c.Cancel(ctx, "boss.1.1"); err != nil {
		t.Fatal(err)
	}

	r := drover(t, append(etcdFlags(ns), "tasks", "get", "boss", "--children", "2")...)
	for _, want := range []string{"waits for:", "3 of the 3 children of step 1", "children:", "3 spawned: 0 succeeded, 1 failed (dead or cancelled), 2 not ended",
		"boss.1.0", "PENDING", "boss.1.1", "CANCELLED"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("tasks get: want %q; exit %d\n%s\n%s", want, r.code, r.stdout, r.stderr)
		}
	}
	if strings.Contains(r.stdout, "boss.1.2") || !strings.Contains(r.stderr, "--children-after 1:2") {
		t.Fatalf("tasks get --children 2: a page of 2 and the next command\n%s\n%s", r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss", "--children", "2", "--children-after", "1:2")...)
	if r.code != 0 || !strings.Contains(r.stdout, "boss.1.2") || strings.Contains(r.stdout, "boss.1.0") {
		t.Fatalf("the next page: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss", "--json")...)
	var v struct {
		Status   string `json:"current_status"`
		Children struct {
			Spawned, Failed, Live int
			Children              []struct {
				ID     string `json:"task_id"`
				Status string `json:"status"`
			} `json:"children"`
		} `json:"children"`
		WaitingFor map[string]any `json:"waiting_for"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Status != "WAITING" || v.Children.Spawned != 3 || v.Children.Failed != 1 ||
		v.Children.Live != 2 || len(v.Children.Children) != 3 || v.Children.Children[1].Status != "CANCELLED" || v.WaitingFor == nil {
		t.Fatalf("tasks get --json: %+v (%v)\n%s", v, err, r.stdout)
	}

	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss.1.0")...)
	if r.code != 0 || !strings.Contains(r.stdout, "parent:") || !strings.Contains(r.stdout, "boss (step 1, queue wf)") || strings.Contains(r.stdout, "children:") {
		t.Fatalf("tasks get of a child: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "boss.1.0", "--json")...)
	if !strings.Contains(r.stdout, `"parent_queue":"wf"`) || strings.Contains(r.stdout, `"children"`) {
		t.Fatalf("tasks get --json of a child: %s", r.stdout)
	}
	for _, args := range [][]string{{"--children", "0"}, {"--children-after", "x"}} {
		if r := drover(t, append(append(etcdFlags(ns), "tasks", "get", "boss"), args...)...); r.code != 2 {
			t.Fatalf("%v: exit %d, want 2: %s", args, r.code, r.stderr)
		}
	}
}
