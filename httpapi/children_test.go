package httpapi_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// TestAgentTaskSpawnOnceAfterCrash: the children of an agent task's step
// are spawned once whatever crashes. (a) The step's checkpoint and plan
// committed and the writer died before submitting: the next claim submits
// them. (b) The client died after its spawn write: the next claim resumes
// after the step, and the old claim's write of the step again, with
// another list, is refused and stores nothing. (c) The client died before
// its write: the next claim's write spawns its own list only. Each child
// runs once.
func TestAgentTaskSpawnOnceAfterCrash(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	k := startKids(t, a, "kids", func(string) ([]byte, error) { return []byte(`"ok"`), nil })
	qc, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	// (a): committed by a writer that then died, nothing submitted.
	locker, err := lock.NewEtcd(ctx, a.cli, lock.EtcdConfig{Namespace: a.ns, TTL: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := store.Claim(ctx, locker, "crash-a", task.ClaimOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := store.Load(ctx, "crash-a")
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	next := task.Checkpoint{TaskID: "crash-a", Step: 1, StepName: "fan", Steps: 2, State: []byte("s"), Worker: "w", Token: l.Token(), At: now}
	req := &task.SpawnRequest{Children: []task.Child{{Queue: "kids", Type: "x"}, {Queue: "kids", Type: "x"}, {Queue: "kids", Type: "x"}}}
	if err := store.CommitSpawn(ctx, l, qc.Spawner(""), cp, &next, task.StepRecord{Step: 1, Name: "fan", Worker: "w", Token: l.Token(), StartedAt: now, FinishedAt: now}, nil, req); err != nil {
		t.Fatal(err)
	}
	if err := locker.Close(ctx); err != nil { // the writer dies: its lease and claim with it
		t.Fatal(err)
	}
	if _, err := qc.Get(ctx, "crash-a.1.0"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("a child submitted before the claim: %v", err)
	}
	s := a.session(30)
	if r := a.claimReady(t, "crash-a", s); r.num("next_step") != 2 {
		t.Fatalf("claim after the crash: %s", r.Raw)
	}

	// (b): the client dies after its spawn write.
	s1 := a.session(30)
	tok := a.claim("crash-b", s1, 200).num("token")
	a.do("PUT", "/v1/agent-tasks/crash-b/steps/1/spawn", map[string]any{"session": s1, "token": tok, "steps": 2, "state": b64("s"), "children": children("kids", 3)}).want(t, 200)
	a.do("DELETE", "/v1/sessions/"+s1, nil).want(t, 204)
	again := map[string]any{"session": s1, "token": tok, "steps": 2, "state": b64("other"), "children": children("kids", 4)}
	a.do("PUT", "/v1/agent-tasks/crash-b/steps/1/spawn", again).problem(t, 409)
	if _, err := qc.Get(ctx, "crash-b.1.3"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("the refused write submitted a fourth child: %v", err)
	}
	if plan, err := store.Plan(ctx, "crash-b", 1); err != nil || len(plan) != 3 {
		t.Fatalf("plan of %d children (%v) after the refused write; want the 3 of the one that committed", len(plan), err)
	}
	if r := a.claimReady(t, "crash-b", s); r.num("next_step") != 2 {
		t.Fatalf("claim after the client died: %s", r.Raw)
	}

	// (c): the client dies before its write; the next one spawns its own.
	s2 := a.session(30)
	tok = a.claim("crash-c", s2, 200).num("token")
	a.do("DELETE", "/v1/sessions/"+s2, nil).want(t, 204)
	a.do("PUT", "/v1/agent-tasks/crash-c/steps/1/spawn", map[string]any{"session": s2, "token": tok, "steps": 2, "state": b64("s"), "children": children("kids", 4)}).problem(t, 409)
	tok = a.claim("crash-c", s, 200).num("token")
	two := []map[string]any{{"key": "b0", "queue": "kids", "task_type": "x"}, {"key": "b1", "queue": "kids", "task_type": "x"}}
	a.do("PUT", "/v1/agent-tasks/crash-c/steps/1/spawn", map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("s"), "children": two}).want(t, 200)
	a.claimReady(t, "crash-c", s)

	want := []string{"crash-a.1.0", "crash-a.1.1", "crash-a.1.2", "crash-b.1.0", "crash-b.1.1", "crash-b.1.2", "crash-c.1.b0", "crash-c.1.b1"}
	runs := k.counts()
	if len(runs) != len(want) {
		t.Fatalf("children run: %v, want %v", runs, want)
	}
	for _, id := range want {
		if runs[id] != 1 {
			t.Fatalf("child %s ran %d times (all: %v)", id, runs[id], runs)
		}
	}
}

// TestAgentTaskSpawnFailFast: without collect, the first child that ends
// DEAD ends the parent's wait while another still runs; here one whose
// result is over the 64 KiB a child may return. The children read names
// it, with its error.
func TestAgentTaskSpawnFailFast(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	release := make(chan struct{})
	startKids(t, a, "kids", func(id string) ([]byte, error) {
		if strings.HasSuffix(id, ".big") {
			return bytes.Repeat([]byte("x"), task.MaxChildResult+1), nil
		}
		<-release
		return nil, nil
	})
	t.Cleanup(func() { close(release) }) // before the worker stops: cleanups run last first
	s := a.session(30)
	tok := a.claim("ff", s, 200).num("token")
	kids := []map[string]any{{"key": "slow", "queue": "kids", "task_type": "x"}, {"key": "big", "queue": "kids", "task_type": "x"}}
	a.do("PUT", "/v1/agent-tasks/ff/steps/1/spawn", map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("s"), "children": kids}).want(t, 200)
	a.claimReady(t, "ff", s)
	r := a.do("GET", "/v1/agent-tasks/ff/children", nil).want(t, 200)
	fc, _ := r.JSON["failed_child"].(map[string]any)
	if r.JSON["ready"] != true || r.num("ended") != 1 || r.num("failed") != 1 || fc["id"] != "ff.1.big" || fc["status"] != "DEAD" ||
		!strings.Contains(fmt.Sprint(fc["error"]), "bytes") {
		t.Fatalf("children after a dead child: %s", r.Raw)
	}
	if one := a.do("GET", "/v1/agent-tasks/ff/children/ff.1.slow", nil).want(t, 200); one.JSON["ended"] == true {
		t.Fatalf("the slow child: %s", one.Raw)
	}
}

// TestAgentTaskSpawnBadInput: a spawn into a queue that does not exist,
// a child that is not valid, two children with one key, wait above their
// number, a spawn from the last step, a bad signal name in a wait: each a
// 400 problem naming the field, nothing stored. A read of a child the task
// did not spawn is a 404 naming path.child.
func TestAgentTaskSpawnBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	startKids(t, a, "kids", func(string) ([]byte, error) { return nil, nil })
	s := a.session(30)
	tok := a.claim("bad", s, 200).num("token")
	write := func(steps int, kids []map[string]any, extra ...any) map[string]any {
		b := map[string]any{"session": s, "token": tok, "steps": steps, "state": b64("s"), "children": kids}
		for i := 0; i+1 < len(extra); i += 2 {
			b[extra[i].(string)] = extra[i+1]
		}
		return b
	}
	kid := func(q, key string) map[string]any { return map[string]any{"queue": q, "task_type": "x", "key": key} }
	before := a.keyCount()
	for _, c := range []struct {
		body  map[string]any
		where string
	}{
		{write(2, []map[string]any{kid("kids", "a"), kid("nowhere", "b")}), "body.children[1].queue"},
		{write(2, []map[string]any{kid("no such queue!", "a")}), "body.children[0].queue"},
		{write(2, []map[string]any{kid("kids", "a"), kid("kids", "a")}), "body.children[1].key"},
		{write(2, []map[string]any{kid("kids", "a.b")}), "body.children[0].key"},
		{write(2, []map[string]any{kid("kids", "a")}, "wait", 2), "body.wait"},
		{write(1, []map[string]any{kid("kids", "a")}), "body.children"},
		{write(2, []map[string]any{{"queue": "kids", "task_type": "x", "timeout": "soon"}}), "body.children[0].timeout"},
		{write(2, []map[string]any{{"queue": "kids", "task_type": "x", "timeout": "NaN"}}), "body.children[0].timeout"},
		{write(2, []map[string]any{{"queue": "kids", "task_type": "x", "timeout": "1e300"}}), "body.children[0].timeout"},
		{write(2, []map[string]any{}, "wait", 1), "body.wait"},
		{write(2, []map[string]any{kid("kids", "a"), {"queue": "kids", "task_type": "x", "priority": 5000}}), "body.children[1].priority"},
		{write(2, []map[string]any{{"queue": "kids", "task_type": "x", "max_retries": 101}}), "body.children[0].max_retries"},
	} {
		p := a.do("PUT", "/v1/agent-tasks/bad/steps/1/spawn", c.body).problem(t, 400)
		errs, _ := p.JSON["errors"].([]any)
		if len(errs) == 0 || errs[0].(map[string]any)["location"] != c.where || !strings.Contains(p.str("detail"), c.where) {
			t.Fatalf("want a problem naming %s: %s", c.where, p.Raw)
		}
	}
	p := a.do("PUT", "/v1/agent-tasks/bad/steps/1", map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("s"),
		"wait_signal": map[string]any{"names": []string{"not a name!"}}}).problem(t, 400)
	if errs, _ := p.JSON["errors"].([]any); len(errs) == 0 || errs[0].(map[string]any)["location"] != "body.wait_signal.names" {
		t.Fatalf("bad signal name: %s", p.Raw)
	}
	if after := a.keyCount(); after != before {
		t.Fatalf("refused writes stored keys: %d before, %d after", before, after)
	}
	a.do("GET", "/v1/agent-tasks/bad/children", nil).problem(t, 404)
	a.do("PUT", "/v1/agent-tasks/bad/steps/1/spawn", write(2, []map[string]any{kid("kids", "a")})).want(t, 200)
	for _, id := range []string{"other.1.a", "bad.2.a", "bad.1.b"} {
		p := a.do("GET", "/v1/agent-tasks/bad/children/"+id, nil).problem(t, 404)
		errs, _ := p.JSON["errors"].([]any)
		if len(errs) == 0 || errs[0].(map[string]any)["location"] != "path.child" || !strings.Contains(p.str("detail"), "not a child") {
			t.Fatalf("child %s: %s", id, p.Raw)
		}
	}
}

// TestAgentTaskSpawnCollect: with collect, a child cancelled from outside
// comes back to the agent task as CANCELLED and the wait goes on until
// every child ended; a detached child is recorded so in the plan.
func TestAgentTaskSpawnCollect(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	qc, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := qc.SetConfig(ctx, "idle", queue.Config{}); err != nil { // no worker: its child waits to be cancelled
		t.Fatal(err)
	}
	startKids(t, a, "kids", func(string) ([]byte, error) { return []byte("plain text"), nil })
	s := a.session(30)
	tok := a.claim("col", s, 200).num("token")
	kids := []map[string]any{{"key": "run", "queue": "kids", "task_type": "x", "detached": true}, {"key": "stuck", "queue": "idle", "task_type": "x"}}
	a.do("PUT", "/v1/agent-tasks/col/steps/1/spawn", map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("s"), "children": kids, "collect": true}).want(t, 200)
	waitFor(t, "the running child to end", func() bool {
		return a.do("GET", "/v1/agent-tasks/col/children", nil).num("ended") == 1
	})
	if c := a.claim("col", s, 200); c.num("token") != 0 {
		t.Fatalf("claimed with a child still pending: %s", c.Raw)
	}
	if _, err := qc.Cancel(ctx, "col.1.stuck"); err != nil {
		t.Fatal(err)
	}
	a.claimReady(t, "col", s)
	r := a.do("GET", "/v1/agent-tasks/col/children", nil).want(t, 200)
	outs, _ := r.JSON["outcomes"].([]any)
	if len(outs) != 2 || r.JSON["failed_child"] != nil || r.num("failed") != 1 {
		t.Fatalf("children: %s", r.Raw)
	}
	run, stuck := outs[0].(map[string]any), outs[1].(map[string]any)
	if run["status"] != "SUCCEEDED" || run["result"] != "plain text" || stuck["status"] != "CANCELLED" {
		t.Fatalf("outcomes: %s", r.Raw)
	}
	store, err := task.NewStore(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	plan, err := store.Plan(ctx, "col", 1)
	if err != nil || len(plan) != 2 || !plan[0].Detached || plan[1].Detached {
		t.Fatalf("plan: %+v %v", plan, err)
	}
}

// claimFence is the fence of an HTTP claim of task id with token tok, as
// the server's writes are fenced: for a test to write as a writer that
// then died.
type claimFence struct {
	cli *clientv3.Client
	key string
	tok int64
}

func newClaimFence(t *testing.T, a *api, id string, tok float64) claimFence {
	t.Helper()
	g, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).Lock(keyspace.TaskLock(id)), clientv3.WithFirstCreate()...)
	if err != nil || len(g.Kvs) == 0 {
		t.Fatalf("claim of %s: %v", id, err)
	}
	return claimFence{cli: a.cli, key: string(g.Kvs[0].Key), tok: int64(tok)}
}

func (f claimFence) Token() int64             { return f.tok }
func (f claimFence) Context() context.Context { return context.Background() }
func (f claimFence) Err() error               { return nil }
func (f claimFence) Txn(ctx context.Context) clientv3.Txn {
	return lease.NewFencedTxn(ctx, f.cli, lease.Spec{Name: "claim", Token: f.tok, Cmp: clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.tok)})
}

// held reports whether task id's claim is held.
func (a *api) held(t *testing.T, id string) bool {
	t.Helper()
	g, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).Lock(keyspace.TaskLock(id)), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count > 0
}

// TestAgentTaskSpawnRepeatAfterCrash: a spawn write committed by a writer
// that died before it submitted the children and released the claim.
// (a) The client writes the step again under its claim: the children are
// submitted and the claim released, not left held with nothing to do.
// (b) The client writes the next step, or completes the task, under the
// claim before the children ended: a 409; once they ended, it may.
func TestAgentTaskSpawnRepeatAfterCrash(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	release := make(chan struct{})
	startKids(t, a, "kids", func(string) ([]byte, error) { <-release; return nil, nil })
	t.Cleanup(func() { close(release) })
	qc, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	s := a.session(30)
	// commitOnly writes step 1 of id as spawning two children under the
	// claim with tok, as a spawn write that died before its submission.
	commitOnly := func(id string, tok float64) {
		cp, err := store.Load(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		f := newClaimFence(t, a, id, tok)
		now := time.Now().UTC()
		next := task.Checkpoint{TaskID: id, Step: 1, StepName: "fan", Steps: 3, State: []byte("s"), Worker: "w", Token: f.tok, At: now}
		req := &task.SpawnRequest{Children: []task.Child{{Queue: "kids", Type: "x"}, {Queue: "kids", Type: "x"}}}
		if err := store.CommitSpawn(ctx, f, qc.Spawner(""), cp, &next, task.StepRecord{Step: 1, Name: "fan", Worker: "w", Token: f.tok, StartedAt: now, FinishedAt: now}, nil, req); err != nil {
			t.Fatal(err)
		}
	}
	spawnBody := func(tok float64) map[string]any {
		return map[string]any{"session": s, "token": tok, "name": "fan", "steps": 3, "state": b64("s"), "children": children("kids", 2)}
	}

	// (a)
	tok := a.claim("rep-a", s, 200).num("token")
	commitOnly("rep-a", tok)
	a.do("PUT", "/v1/agent-tasks/rep-a/steps/1/spawn", spawnBody(tok)).want(t, 200)
	if _, err := qc.Get(ctx, "rep-a.1.0"); err != nil {
		t.Fatalf("the repeated write did not submit the children: %v", err)
	}
	if a.held(t, "rep-a") {
		t.Fatal("the repeated write left the claim held")
	}

	// (b)
	tok = a.claim("rep-b", s, 200).num("token")
	commitOnly("rep-b", tok)
	next := map[string]any{"session": s, "token": tok, "name": "s2", "steps": 3, "state": b64("t")}
	a.do("PUT", "/v1/agent-tasks/rep-b/steps/2", next).problem(t, 409)
	a.do("POST", "/v1/agent-tasks/rep-b/complete", map[string]any{"session": s, "token": tok}).problem(t, 409)
	if cp, err := store.Load(ctx, "rep-b"); err != nil || cp.Step != 1 || cp.Completed {
		t.Fatalf("checkpoint %+v (%v); want step 1, not completed", cp, err)
	}
	if _, err := qc.Get(ctx, "rep-b.1.1"); err != nil {
		t.Fatalf("the refused write did not submit the children: %v", err)
	}
}

// TestAgentTaskSpawnBesideCancelledQueueTask: an agent task that shares
// its id with a cancelled queue task spawns children that live: the
// queue task is not their parent.
func TestAgentTaskSpawnBesideCancelledQueueTask(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	release := make(chan struct{})
	startKids(t, a, "kids", func(string) ([]byte, error) { <-release; return nil, nil })
	t.Cleanup(func() { close(release) })
	qc, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Submit(ctx, "other", []queue.Task{{ID: "twin", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Cancel(ctx, "twin"); err != nil {
		t.Fatal(err)
	}
	s := a.session(30)
	tok := a.claim("twin", s, 200).num("token")
	a.do("PUT", "/v1/agent-tasks/twin/steps/1/spawn", map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("s"), "children": children("kids", 2)}).want(t, 200)
	for _, id := range []string{"twin.1.0", "twin.1.1"} {
		if c, err := qc.Get(ctx, id); err != nil || c.CurrentStatus == queue.Cancelled {
			t.Fatalf("child %s: %+v (%v); want it live", id, c, err)
		}
	}
}
