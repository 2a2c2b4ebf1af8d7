package httpapi_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"

	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// waitFor polls cond for up to a minute.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestSignalWakesWaitingQueueTask: a queue step task waiting for a signal
// shows WAITING with waiting_for; POST /v1/tasks/{id}/signals/{name} is
// 202, stored and woke; the same key again (header) stores nothing; the
// task completes with the signal and GET shows it consumed; a signal to
// the finished task is 409.
func TestSignalWakesWaitingQueueTask(t *testing.T) {
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
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: "q"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	got, release := make(chan string, 1), make(chan struct{})
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "plan", Run: func(context.Context, []byte) ([]byte, error) {
			return []byte("plan"), task.WaitSignal("approval", time.Hour)
		}},
		task.Step{Name: "act", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			sg, _ := task.ReceivedSignal(ctx)
			got <- string(sg.Data)
			<-release // the test sends the signal again meanwhile
			return s, nil
		}}))
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran })
	if _, err := c.Submit(ctx, "q", []queue.Task{{ID: "approve-1", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	var r resp
	waitFor(t, "WAITING", func() bool {
		r = a.do("GET", "/v1/queues/q/tasks/approve-1", nil)
		return r.str("current_status") == "WAITING"
	})
	wf, _ := r.JSON["waiting_for"].(map[string]any)
	if sigs, _ := wf["signals"].([]any); len(sigs) != 1 || sigs[0] != "approval" || wf["until"] == nil || r.str("scheduled_at") == "" {
		t.Fatalf("waiting task: %s", r.Raw)
	}
	if st := a.do("GET", "/v1/queues/q/stats", nil).want(t, 200); st.num("waiting") != 1 {
		t.Fatalf("stats: %s", st.Raw)
	}
	if l := a.do("GET", "/v1/queues/q/tasks?status=WAITING", nil).want(t, 200); len(l.JSON["tasks"].([]any)) != 1 {
		t.Fatalf("list WAITING: %s", l.Raw)
	}
	s := a.do("POST", "/v1/tasks/approve-1/signals/approval", map[string]any{"data": map[string]any{"ok": true}}, "Idempotency-Key: r-1").want(t, 202)
	if s.JSON["stored"] != true || s.JSON["woke"] != true || s.str("idempotency_key") != "r-1" || s.str("current_status") != "WAITING" {
		t.Fatalf("signal: %s", s.Raw)
	}
	if data := <-got; data != `{"ok":true}` {
		t.Fatalf("the step received %q", data)
	}
	if again := a.do("POST", "/v1/tasks/approve-1/signals/approval", nil, "Idempotency-Key: r-1").want(t, 202); again.JSON["stored"] != false || again.JSON["woke"] != false {
		t.Fatalf("the same signal again: %s", again.Raw)
	}
	close(release)
	waitFor(t, "SUCCEEDED", func() bool {
		r = a.do("GET", "/v1/queues/q/tasks/approve-1", nil)
		return r.str("current_status") == "SUCCEEDED"
	})
	sigs, _ := r.JSON["signals"].([]any)
	if len(sigs) != 1 || sigs[0].(map[string]any)["consumed"] != true || r.JSON["waiting_for"] != nil {
		t.Fatalf("finished task: %s", r.Raw)
	}
	a.do("POST", "/v1/tasks/approve-1/signals/approval", nil).problem(t, 409)
}

// TestSignalBadInput: unknown task 404, bad name 400 naming path.name, a
// body key that differs from the header 400, nothing stored.
func TestSignalBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "t1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	a.do("POST", "/v1/tasks/nobody/signals/approval", nil).problem(t, 404)
	p := a.do("POST", "/v1/tasks/t1/signals/bad%20name", nil).problem(t, 400)
	if errs, _ := p.JSON["errors"].([]any); len(errs) == 0 || errs[0].(map[string]any)["location"] != "path.name" {
		t.Fatalf("bad name: %s", p.Raw)
	}
	a.do("POST", "/v1/tasks/t1/signals/approval", map[string]any{"idempotency_key": "a"}, "Idempotency-Key: b").problem(t, 400)
	a.do("POST", "/v1/tasks/t1/signals/approval", map[string]any{"idempotency_key": "a/b"}).problem(t, 400)
	if sigs, err := c.Signals(context.Background(), "t1"); err != nil || len(sigs) != 0 {
		t.Fatalf("signals %+v (%v): want none", sigs, err)
	}
}

// TestAgentTaskWaitsForSignal: a step write with wait_signal releases the
// claim; a claim then answers waiting_for and holds nothing; after the
// signal (202, stored, nothing to wake) a claim answers it in signal; the
// next step's write consumes it.
func TestAgentTaskWaitsForSignal(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("reviewer", s, 200).num("token")
	w := a.do("PUT", "/v1/agent-tasks/reviewer/steps/1", map[string]any{"session": s, "token": tok, "steps": 3, "state": b64("draft"),
		"wait_signal": map[string]any{"names": []string{"approval"}, "timeout": "24h"}}).want(t, 200)
	if wf, _ := w.JSON["waiting_for"].(map[string]any); wf == nil || wf["until"] == nil {
		t.Fatalf("step write: %s", w.Raw)
	}
	if r := a.claim("reviewer", s, 200); r.JSON["token"] != nil || r.JSON["waiting_for"] == nil {
		t.Fatalf("claim before the signal: %s", r.Raw)
	}
	sig := a.do("POST", "/v1/tasks/reviewer/signals/approval", map[string]any{"data": "yes", "idempotency_key": "k"}).want(t, 202)
	if sig.JSON["stored"] != true || sig.JSON["woke"] != false {
		t.Fatalf("signal: %s", sig.Raw)
	}
	r := a.claim("reviewer", s, 200)
	sg, _ := r.JSON["signal"].(map[string]any)
	if r.num("token") == 0 || sg["name"] != "approval" || sg["data"] != "yes" || r.num("next_step") != 2 {
		t.Fatalf("claim after the signal: %s", r.Raw)
	}
	a.do("PUT", "/v1/agent-tasks/reviewer/steps/2", map[string]any{"session": s, "token": r.num("token"), "state": b64("done")}).want(t, 200)
	c, _ := queue.NewClient(a.cli, a.ns)
	sigs, err := c.Signals(context.Background(), "reviewer")
	if err != nil || len(sigs) != 1 || !sigs[0].Consumed {
		t.Fatalf("signals %+v (%v): want one, consumed", sigs, err)
	}
	a.do("PUT", "/v1/agent-tasks/reviewer/steps/3", map[string]any{"session": s, "token": r.num("token"), "state": b64("x"),
		"wait_signal": map[string]any{"names": []string{"a/b"}}}).problem(t, 400)
}

// A signal while the store is past its high-water mark answers 507 with
// Retry-After and the guard's figures, and stores nothing; once the guard
// clears, the same signal is stored.
func TestSignalStoreFull(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/sf/tasks", qtasksJSON("sf", 1)).want(t, 200)
	keys := keyspace.MustNew(a.ns)
	if err := storeguard.Set(context.Background(), a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.7, LowWater: 0.6, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	before := a.keyCount()
	r := a.do("POST", "/v1/tasks/sf-0/signals/go", map[string]any{"idempotency_key": "k"}).problem(t, 507)
	if r.Header.Get("Retry-After") == "" || !strings.Contains(r.str("detail"), "quota") {
		t.Fatalf("507 without Retry-After or usage: %v %s", r.Header, r.Raw)
	}
	if n := a.keyCount(); n != before {
		t.Fatalf("%d keys before a refused signal, %d after", before, n)
	}
	if err := storeguard.Clear(context.Background(), a.cli, keys); err != nil {
		t.Fatal(err)
	}
	if r := a.do("POST", "/v1/tasks/sf-0/signals/go", map[string]any{"idempotency_key": "k"}).want(t, 202); r.JSON["stored"] != true {
		t.Fatalf("the signal once the guard cleared: %s", r.Raw)
	}
}
