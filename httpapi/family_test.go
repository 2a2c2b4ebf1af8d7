package httpapi_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// startSpawner runs a worker of queue wf whose step tasks spawn n
// children into queue kids (which no worker runs) and wait for all of
// them, collecting every outcome.
func startSpawner(t *testing.T, a *api, n int) *queue.Client {
	t.Helper()
	ctx := context.Background()
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, "kids", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: "wf"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	kids := make([]task.Child, n)
	for i := range kids {
		kids[i] = task.Child{Queue: "kids", Type: "search"}
	}
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
			return nil, task.Spawn(kids, task.SpawnOptions{Collect: true})
		}},
		task.Step{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	return c
}

// TestTaskShowsChildrenAndParent: GET of a parent that waits for its
// children gives their counts by state and the first page with each
// child's state (one acked SUCCEEDED, one cancelled CANCELLED, the rest
// PENDING); GET .../children pages through them with a cursor; a child
// shows its parent's queue; a cursor that is not one is a 400 naming it.
func TestTaskShowsChildrenAndParent(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	c := startSpawner(t, a, 5)
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: "boss", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the parent WAITING", func() bool {
		return a.do("GET", "/v1/queues/wf/tasks/boss", nil).str("current_status") == "WAITING"
	})
	sess := a.session(60)
	var claimed resp
	waitFor(t, "a child claimed", func() bool {
		claimed = a.do("POST", "/v1/queues/kids/claim", map[string]any{"session": sess, "max": 1}).want(t, 200)
		ts, _ := claimed.JSON["tasks"].([]any)
		return len(ts) == 1
	})
	k := claimed.JSON["tasks"].([]any)[0].(map[string]any)
	acked := k["task_id"].(string)
	a.do("POST", "/v1/queues/kids/tasks/"+acked+"/ack", map[string]any{"session": sess, "token": k["token"], "result": map[string]any{"hits": 3}}).want(t, 200)
	cancelled := "boss.1.4"
	if acked == cancelled {
		cancelled = "boss.1.3"
	}
	a.do("POST", "/v1/queues/kids/tasks/"+cancelled+"/cancel", nil).want(t, 200)

	var r resp
	waitFor(t, "the counts", func() bool {
		r = a.do("GET", "/v1/queues/wf/tasks/boss", nil).want(t, 200)
		ch, _ := r.JSON["children"].(map[string]any)
		return ch != nil && ch["succeeded"] == float64(1) && ch["failed"] == float64(1)
	})
	ch := r.JSON["children"].(map[string]any)
	if ch["spawned"] != float64(5) || ch["live"] != float64(3) || len(ch["steps"].([]any)) != 1 || ch["next_cursor"] != nil {
		t.Fatalf("children: %s", r.Raw)
	}
	states := map[string]string{}
	for _, x := range ch["children"].([]any) {
		m := x.(map[string]any)
		states[m["task_id"].(string)] = m["status"].(string)
		if m["queue"] != "kids" || m["step"] != float64(1) {
			t.Fatalf("child %v", m)
		}
	}
	if len(states) != 5 || states[acked] != "SUCCEEDED" || states[cancelled] != "CANCELLED" {
		t.Fatalf("states %v", states)
	}
	for id, st := range states {
		if id != acked && id != cancelled && st != "PENDING" {
			t.Fatalf("%s is %s, want PENDING", id, st)
		}
	}

	p1 := a.do("GET", "/v1/queues/wf/tasks/boss/children?limit=2", nil).want(t, 200)
	next := p1.str("next_cursor")
	if len(p1.JSON["children"].([]any)) != 2 || next == "" {
		t.Fatalf("first page: %s", p1.Raw)
	}
	seen := 2
	for next != "" {
		p := a.do("GET", "/v1/queues/wf/tasks/boss/children?limit=2&cursor="+next, nil).want(t, 200)
		seen += len(p.JSON["children"].([]any))
		next = p.str("next_cursor")
	}
	if seen != 5 {
		t.Fatalf("the pages list %d children, want 5", seen)
	}

	kid := a.do("GET", "/v1/queues/kids/tasks/boss.1.2", nil).want(t, 200)
	if kid.str("parent") != "boss" || kid.str("parent_queue") != "wf" || kid.JSON["children"] != nil {
		t.Fatalf("child: %s", kid.Raw)
	}
	none := a.do("GET", "/v1/queues/kids/tasks/boss.1.2/children", nil).want(t, 200)
	if none.num("spawned") != 0 || len(none.JSON["children"].([]any)) != 0 {
		t.Fatalf("children of a childless task: %s", none.Raw)
	}
	bad := a.do("GET", "/v1/queues/wf/tasks/boss/children?cursor=nope", nil).problem(t, 400)
	if errs, _ := bad.JSON["errors"].([]any); len(errs) == 0 || errs[0].(map[string]any)["location"] != "query.cursor" {
		t.Fatalf("bad cursor: %s", bad.Raw)
	}
	a.do("GET", "/v1/queues/kids/tasks/boss/children", nil).problem(t, 404)
}
