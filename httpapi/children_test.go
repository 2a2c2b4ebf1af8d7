package httpapi_test

import (
	"context"
	"sync"
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

// kidsWorker runs queue q's tasks in process with run, counting each
// task's runs, until the test ends.
type kidsWorker struct {
	mu   sync.Mutex
	runs map[string]int
}

func startKids(t *testing.T, a *api, q string, run func(id string) ([]byte, error)) *kidsWorker {
	t.Helper()
	ctx := context.Background()
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetConfig(ctx, q, queue.Config{}); err != nil {
		t.Fatal(err)
	}
	k := &kidsWorker{runs: map[string]int{}}
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: q})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(_ context.Context, tk *queue.Task) ([]byte, error) {
		k.mu.Lock()
		k.runs[tk.ID]++
		k.mu.Unlock()
		return run(tk.ID)
	})
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran; _ = w.Close(context.Background()) })
	return k
}

// counts returns a copy of the runs counted.
func (k *kidsWorker) counts() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := make(map[string]int, len(k.runs))
	for id, n := range k.runs {
		out[id] = n
	}
	return out
}

// claimReady claims task id under session until the claim answers a
// token (the children's wait is over) and returns the answer.
func (a *api) claimReady(t *testing.T, id, session string) resp {
	t.Helper()
	var r resp
	waitFor(t, id+" ready", func() bool {
		r = a.claim(id, session, 200)
		return r.num("token") > 0
	})
	return r
}

// children is the spawn write's list of n children of queue q.
func children(q string, n int) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = map[string]any{"queue": q, "task_type": "search", "parameters": map[string]any{"i": i}}
	}
	return out
}

// TestAgentTaskSpawnFanIn: an agent task's step write spawns five
// children over HTTP and releases the claim; a claim before they all ended
// holds nothing and answers waiting_for.children; once they ended it
// answers a token, and the children read gives each child's status and
// result. The same write sent again (a lost answer) is answered from the
// checkpoint and spawns nothing; each child ran once.
func TestAgentTaskSpawnFanIn(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	release := make(chan struct{})
	k := startKids(t, a, "kids", func(id string) ([]byte, error) {
		<-release
		return []byte(`{"from":"` + id + `"}`), nil
	})
	s := a.session(30)
	tok := a.claim("lead", s, 200).num("token")
	kids := children("kids", 5)
	kids[4]["key"] = "last"
	body := map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("plan"), "children": kids}
	w := a.do("PUT", "/v1/agent-tasks/lead/steps/1/spawn", body).want(t, 200)
	wf, _ := w.JSON["waiting_for"].(map[string]any)
	if ch, _ := wf["children"].(map[string]any); ch == nil || ch["n"] != float64(5) || ch["wait"] != float64(5) || w.num("next_step") != 2 {
		t.Fatalf("spawn write: %s", w.Raw)
	}
	c := a.claim("lead", s, 200)
	if c.num("token") != 0 || c.JSON["waiting_for"] == nil {
		t.Fatalf("claim while the children run: %s", c.Raw)
	}
	a.do("PUT", "/v1/agent-tasks/lead/steps/1/spawn", body).want(t, 200) // a repeat: answered, nothing spawned
	close(release)
	ready := a.claimReady(t, "lead", s)
	if ready.num("next_step") != 2 || unb64(t, ready, "state") != "plan" {
		t.Fatalf("claim once they ended: %s", ready.Raw)
	}
	r := a.do("GET", "/v1/agent-tasks/lead/children", nil).want(t, 200)
	outs, _ := r.JSON["outcomes"].([]any)
	if r.num("n") != 5 || r.num("ended") != 5 || r.JSON["ready"] != true || r.JSON["submitted"] != true || len(outs) != 5 {
		t.Fatalf("children: %s", r.Raw)
	}
	for _, o := range outs {
		m := o.(map[string]any)
		res, _ := m["result"].(map[string]any)
		if m["status"] != "SUCCEEDED" || m["ended"] != true || res["from"] != m["id"] {
			t.Fatalf("outcome %v", m)
		}
	}
	if one := a.do("GET", "/v1/agent-tasks/lead/children/lead.1.last", nil).want(t, 200); one.str("status") != "SUCCEEDED" || one.str("queue") != "kids" {
		t.Fatalf("one child: %s", one.Raw)
	}
	p := a.do("GET", "/v1/agent-tasks/lead/children?limit=2", nil).want(t, 200)
	if got, _ := p.JSON["outcomes"].([]any); len(got) != 2 || p.str("next") != "lead.1.1" {
		t.Fatalf("a page of 2: %s", p.Raw)
	}
	a.do("PUT", "/v1/agent-tasks/lead/steps/2", map[string]any{"session": s, "token": ready.num("token"), "steps": 2, "state": b64("merged")}).want(t, 200)
	runs := k.counts()
	if len(runs) != 5 {
		t.Fatalf("children run: %v", runs)
	}
	for id, n := range runs {
		if n != 1 {
			t.Fatalf("child %s ran %d times", id, n)
		}
	}
}
