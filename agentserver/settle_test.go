package agentserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
)

// strandRun stores a run record of thread th that has no task, created
// at created, and marks the thread busy, as a createRun whose submit
// never happened leaves them.
func strandRun(t *testing.T, a *api, th, id string, created time.Time) {
	t.Helper()
	sp := keyspace.MustNew(a.ns)
	rec, _ := json.Marshal(map[string]any{"run_id": id, "thread_id": th, "assistant_id": "agent", "created_at": created, "updated_at": created,
		"status": "pending", "metadata": map[string]any{}, "kwargs": map[string]any{}, "multitask_strategy": "reject", "graph_id": "agent"})
	if _, err := a.cli.Put(context.Background(), sp.AgentRun(th, id), string(rec)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.cli.Put(context.Background(), sp.AgentActiveRun(th, id), ""); err != nil {
		t.Fatal(err)
	}
	got, err := a.cli.Get(context.Background(), sp.AgentThread(th))
	if err != nil {
		t.Fatal(err)
	}
	var thread map[string]any
	if err := json.Unmarshal(got.Kvs[0].Value, &thread); err != nil {
		t.Fatal(err)
	}
	thread["status"] = "busy"
	raw, _ := json.Marshal(thread)
	if _, err := a.cli.Put(context.Background(), sp.AgentThread(th), string(raw)); err != nil {
		t.Fatal(err)
	}
}

// storedRun is run id's record as stored.
func storedRun(t *testing.T, a *api, th, id string) map[string]any {
	t.Helper()
	got, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).AgentRun(th, id))
	if err != nil || len(got.Kvs) == 0 {
		t.Fatalf("run record %s: %v (%d)", id, err, len(got.Kvs))
	}
	var r map[string]any
	if err := json.Unmarshal(got.Kvs[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	return r
}

// A run left pending without a task ends on a cancel: the cancel writes it
// ended and frees the thread, so that it can be deleted and a new run made.
func TestCancelEndsARunWithoutItsTask(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := "1f0a0000-0000-4000-8000-000000000001"
	strandRun(t, a, th, id, time.Now().UTC())
	if got := a.must(200, "GET", "/threads/"+th+"/runs/"+id, nil).Obj; got["status"] != "pending" {
		t.Fatalf("young stranded run %v: want pending within the grace", got["status"])
	}
	a.must(409, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
	a.must(204, "POST", "/threads/"+th+"/runs/"+id+"/cancel", nil)
	if r := storedRun(t, a, th, id); r["ended"] != true || r["status"] != "interrupted" {
		t.Fatalf("cancelled run stored %v: want ended interrupted", r)
	}
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] != "idle" {
		t.Fatalf("thread %v: want idle once its run is cancelled", got["status"])
	}
	a.must(204, "DELETE", "/threads/"+th+"/runs/"+id, nil)
	a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
}

// A run without its task past the grace has ended: a read writes it so
// and frees its thread; a new run is accepted.
func TestReadSettlesARunWhoseTaskIsGone(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := "1f0a0000-0000-4000-8000-000000000002"
	strandRun(t, a, th, id, time.Now().UTC().Add(-time.Hour))
	if got := a.must(200, "GET", "/threads/"+th+"/runs/"+id, nil).Obj; got["status"] != "error" {
		t.Fatalf("run without its task for an hour %v: want error", got["status"])
	}
	if r := storedRun(t, a, th, id); r["ended"] != true {
		t.Fatalf("run stored %v: want ended", r)
	}
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] == "busy" {
		t.Fatalf("thread still busy after its run was found ended")
	}
	a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
}

// A cancelled task's run is written ended, so that it stays interrupted
// once the queue drops the task.
func TestCancelWritesTheRunEnded(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	a.must(204, "POST", "/threads/"+th+"/runs/"+id+"/cancel", nil)
	if r := storedRun(t, a, th, id); r["ended"] != true || r["status"] != "interrupted" {
		t.Fatalf("cancelled run stored %v: want ended interrupted", r)
	}
}

// An outcome leaves the thread busy while another run of it is active,
// and one from a runtime whose claim ended is refused, changing nothing.
func TestOutcomeKeepsAnotherRunsBusy(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	token := claimRun(t, a)
	other := "1f0a0000-0000-4000-8000-000000000003"
	strandRun(t, a, th, other, time.Now().UTC())
	out := "/v1/agent-server/threads/" + th + "/runs/" + id + "/outcome"
	a.must(409, "PUT", out, map[string]any{"token": token + 1, "status": "success"})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success",
		"state": map[string]any{"values": map[string]any{"x": 1}, "next": []any{}, "tasks": []any{}}})
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj["status"]; st != "busy" {
		t.Fatalf("thread %v after an outcome while another run is active: want busy", st)
	}
}

// claimRun claims the namespace's one run task as a runtime would, and
// returns the claim's token.
func claimRun(t testing.TB, a *api) int64 {
	t.Helper()
	ctx := context.Background()
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = q.Close(ctx) })
	l, err := lease.Grant(ctx, a.cli, 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(ctx) })
	got, err := q.Claim(ctx, "langgraph", queue.ClaimRequest{Lease: l, Worker: "rt", Wait: 10 * time.Second})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v (%d)", err, len(got))
	}
	return got[0].Token
}

// An outcome over a megabyte is taken: its history is kept newest first
// as far as it fits; a state too large to store is refused, storing nothing.
func TestLargeOutcomeKeepsTheHistoryThatFits(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	token := claimRun(t, a)
	state := func(cp string, size int) map[string]any {
		return map[string]any{"values": map[string]any{"text": strings.Repeat("x", size)}, "next": []any{}, "tasks": []any{},
			"checkpoint": map[string]any{"checkpoint_id": cp}}
	}
	out := "/v1/agent-server/threads/" + th + "/runs/" + id + "/outcome"
	a.must(413, "PUT", out, map[string]any{"token": token, "status": "success", "state": state("big", 700<<10)})
	if r := storedRun(t, a, th, id); r["ended"] == true {
		t.Fatalf("a refused outcome ended the run: %v", r)
	}
	var hist []any
	for i := range 10 {
		hist = append(hist, state(fmt.Sprint("h", i), 150<<10))
	}
	body := map[string]any{"token": token, "status": "success", "state": state("h0", 150<<10), "history": hist}
	if raw, _ := json.Marshal(body); len(raw) < 1200<<10 {
		t.Fatalf("outcome of %d bytes: the test wants over 1.2 MB", len(raw))
	}
	a.must(200, "PUT", out, body)
	got := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{"limit": 100}).List
	if len(got) < 2 || len(got) >= 10 {
		t.Fatalf("history of %d states: want the newest that fit, fewer than the 10 sent", len(got))
	}
	for i, st := range got {
		if cp := st["checkpoint"].(map[string]any)["checkpoint_id"]; cp != fmt.Sprint("h", i) {
			t.Fatalf("history[%d] is %v: want newest first", i, cp)
		}
	}
}

// Deleting a thread deletes its checkpoints and cancels its runs' tasks.
func TestDeleteThreadCancelsItsRunsAndCheckpoints(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	ctx := context.Background()
	cp := keyspace.MustNew(a.ns).Checkpoints(th) + "x"
	if _, err := a.cli.Put(ctx, cp, "{}"); err != nil {
		t.Fatal(err)
	}
	a.must(204, "DELETE", "/threads/"+th, nil)
	if got, err := a.cli.Get(ctx, cp); err != nil || len(got.Kvs) != 0 {
		t.Fatalf("checkpoint key after the thread's delete: %v (%d)", err, len(got.Kvs))
	}
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(ctx) }()
	task, err := q.Get(ctx, id)
	if err != nil || task.CurrentStatus != queue.Cancelled {
		t.Fatalf("the deleted thread's run task: %v %v, want cancelled", err, task)
	}
}

// A busy thread whose run ended without an outcome is put right by its read.
func TestThreadReadRepairsABusyThread(t *testing.T) {
	a := newAPI(t)
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	strandRun(t, a, th, "1f0a0000-0000-4000-8000-000000000004", time.Now().UTC().Add(-time.Hour))
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj["status"]; st == "busy" {
		t.Fatalf("thread %v: want it put right once its run is found ended", st)
	}
}

// What a run's request asks that is not served is a 501 naming it.
func TestRunOptionsNotServedAre501(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	for field, v := range map[string]string{"on_disconnect": "cancel", "on_completion": "delete"} {
		if ans := a.must(501, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", field: v}); !strings.Contains(ans.Raw, "body."+field) {
			t.Fatalf("%s %s answered %s: want it named", field, v, ans.Raw)
		}
	}
	if n := len(a.must(200, "GET", "/threads/"+th+"/runs", nil).List); n != 0 {
		t.Fatalf("%d runs stored by refused requests", n)
	}
}

// A quiet run stream sends SSE comments, so that it is kept open.
func TestQuietStreamSendsKeepalives(t *testing.T) {
	defer agentserver.SetStreamKeepalive(20 * time.Millisecond)()
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", a.base+"/threads/"+th+"/runs/"+id+"/stream", nil)
	for k, v := range a.hdr {
		req.Header[k] = v
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("the stream ended without a keepalive: %v", err)
		}
		if line == ": keepalive\n" {
			return
		}
	}
}
