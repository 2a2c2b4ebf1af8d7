package agentserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runtime claims the namespace's runs as a Go queue worker and answers
// each with end(params, token); it stops with the test.
func runtime(t *testing.T, a *api, end func(ctx context.Context, p map[string]any, token int64) []byte) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: "langgraph", Concurrency: 2, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
		var p map[string]any
		if err := json.Unmarshal(task.Parameters, &p); err != nil {
			return nil, err
		}
		if res := end(ctx, p, task.Token); res != nil {
			return res, nil
		}
		return []byte(`{"status":"success"}`), nil
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		cctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		if err := w.Close(cctx); err != nil {
			t.Error(err)
		}
	})
}

func TestRunIsAQueueTaskItsRuntimeEnds(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	if ans := a.must(404, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "nograph"}); !strings.HasPrefix(ans.Obj["detail"].(string), `No assistant found for "nograph"`) {
		t.Fatalf("404 detail %q: want LangGraph's", ans.Obj["detail"])
	}
	a.must(400, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "input": map[string]any{}, "command": map[string]any{"resume": 1}})
	a.must(501, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "webhook": "http://127.0.0.1:1/x"})
	run := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "input": map[string]any{"n": 1}}).Obj
	id := run["run_id"].(string)
	if run["status"] != "pending" || run["thread_id"] != th {
		t.Fatalf("created %v: want pending on the thread", run)
	}
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] != "busy" {
		t.Fatalf("thread %v: want busy while its run is pending", got["status"])
	}
	// reject (the default) refuses a second run while the first is active, storing nothing.
	a.must(409, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
	if n := len(a.must(200, "GET", "/threads/"+th+"/runs", nil).List); n != 1 {
		t.Fatalf("%d runs after a rejected one, want 1", n)
	}
	// An outcome under a token that holds no claim is refused.
	a.must(409, "PUT", "/v1/agent-server/threads/"+th+"/runs/"+id+"/outcome", map[string]any{"token": 1, "status": "success"})

	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		in := r["kwargs"].(map[string]any)["input"]
		st := map[string]any{"values": map[string]any{"in": in, "graph": p["graph_id"]}, "next": []any{}, "tasks": []any{},
			"metadata": map[string]any{}, "checkpoint": map[string]any{"checkpoint_id": "c2"}}
		old := map[string]any{"values": map[string]any{}, "next": []any{"agent"}, "tasks": []any{}, "metadata": map[string]any{}, "checkpoint": map[string]any{"checkpoint_id": "c1"}}
		ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st, "history": []any{st, old}})
		if ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	vals := a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/join", nil).Obj
	if vals["graph"] != "agent" || fmt.Sprint(vals["in"]) != "map[n:1]" {
		t.Fatalf("join answered %v: want the state the runtime reported", vals)
	}
	if got := a.must(200, "GET", "/threads/"+th+"/runs/"+id, nil).Obj; got["status"] != "success" {
		t.Fatalf("run %v: want success", got)
	}
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] != "idle" || got["values"].(map[string]any)["graph"] != "agent" {
		t.Fatalf("thread %v: want idle with the run's values", got)
	}
	hist := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{"limit": 5}).List
	if len(hist) != 2 || hist[1]["checkpoint"].(map[string]any)["checkpoint_id"] != "c1" {
		t.Fatalf("history %v: want the two states reported, newest first", hist)
	}
	if got := a.must(200, "GET", "/threads/"+th+"/state/c1", nil).Obj; fmt.Sprint(got["next"]) != "[agent]" {
		t.Fatalf("state at c1 %v", got)
	}
	// A stateless wait runs on a thread of its own.
	w := a.must(200, "POST", "/runs/wait", map[string]any{"assistant_id": "agent", "input": "solo"}).Obj
	if w["in"] != "solo" {
		t.Fatalf("stateless wait answered %v", w)
	}
	a.must(204, "DELETE", "/threads/"+th+"/runs/"+id, nil)
	a.must(404, "GET", "/threads/"+th+"/runs/"+id, nil)
	second := a.must(200, "POST", "/threads/"+th+"/runs/wait", map[string]any{"assistant_id": "agent", "input": 2}).Obj
	if second["in"] != float64(2) {
		t.Fatalf("second run answered %v", second)
	}
	// Deleting the thread deletes its runs and its state.
	sp := keyspace.MustNew(a.ns)
	count := func() int64 {
		runs, err := a.cli.Get(context.Background(), sp.AgentRuns(th), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		st, err := a.cli.Get(context.Background(), sp.AgentThreadState(th), clientv3.WithCountOnly())
		if err != nil {
			t.Fatal(err)
		}
		return runs.Count + st.Count
	}
	if n := count(); n != 2 {
		t.Fatalf("%d keys of the thread's run and state before its delete, want 2", n)
	}
	a.must(204, "DELETE", "/threads/"+th, nil)
	if n := count(); n != 0 {
		t.Fatalf("%d keys of the thread's runs and state left after its delete", n)
	}
}

func TestCancelPendingRun(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	a.must(204, "POST", "/threads/"+th+"/runs/"+id+"/cancel?wait=1", nil)
	if got := a.must(200, "GET", "/threads/"+th+"/runs/"+id, nil).Obj; got["status"] != "interrupted" {
		t.Fatalf("cancelled run %v: want interrupted", got["status"])
	}
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] != "idle" {
		t.Fatalf("thread %v: want idle once its run is cancelled", got["status"])
	}
	id = a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	a.must(204, "POST", "/threads/"+th+"/runs/"+id+"/cancel?action=rollback", nil)
	a.must(404, "GET", "/threads/"+th+"/runs/"+id, nil)
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] != "idle" {
		t.Fatalf("thread %v: want idle once its run is rolled back", got["status"])
	}
}

// A join lasts as long as its run, not the API's request timeout; and a
// run's stream answers what its runtime emitted, as server-sent events.
func TestJoinAndStreamOutliveTheRequestTimeout(t *testing.T) {
	a := newAPI(t, func(c *httpapi.Config) { c.RequestTimeout = 200 * time.Millisecond })
	a.hc.Timeout = time.Minute
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	release := make(chan struct{})
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		<-release
		if err := stream.Emit(ctx, "values", map[string]any{"done": true}); err != nil {
			t.Error(err)
		}
		if err := stream.Flush(ctx); err != nil {
			t.Error(err)
		}
		r := p["run"].(map[string]any)
		st := map[string]any{"values": map[string]any{"done": true}, "next": []any{}, "tasks": []any{}}
		if ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": st}); ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	joined := make(chan answer, 1)
	go func() { joined <- a.do("GET", "/threads/"+th+"/runs/"+id+"/join", nil) }()
	time.Sleep(4 * 200 * time.Millisecond) // past the request timeout: a bounded join would have answered 5xx by now
	select {
	case ans := <-joined:
		t.Fatalf("join answered %d before its run ended: %s", ans.Status, ans.Raw)
	default:
	}
	close(release)
	if ans := <-joined; ans.Status != 200 || ans.Obj["done"] != true {
		t.Fatalf("join answered %d %s: want the run's values", ans.Status, ans.Raw)
	}
	sse := a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/stream", nil)
	if !strings.Contains(sse.Raw, "event: values\ndata: {\"done\":true}\nid: ") || strings.Contains(sse.Raw, "attempt_started") || strings.Contains(sse.Raw, "event: done") {
		t.Fatalf("stream %q: want SSE without drover's own events", sse.Raw)
	}
	a.hdr.Set("Last-Event-ID", "-1")
	if sse := a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/stream", nil); !strings.Contains(sse.Raw, "event: values") {
		t.Fatalf("stream from -1 %q: want every event", sse.Raw)
	}
	a.hdr.Set("Last-Event-ID", "x")
	a.must(400, "GET", "/threads/"+th+"/runs/"+id+"/stream", nil)
}

// A state update is a task the runtime of the thread's graph answers; the
// state it answers becomes the thread's.
func TestUpdateStateThroughTheRuntime(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	bare := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	a.must(409, "POST", "/threads/"+bare+"/state", map[string]any{"values": map[string]any{"x": 1}})
	th := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"graph_id": "agent"}}).Obj["thread_id"].(string)
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		if p["op"] != "update_state" || p["thread_id"] != th || p["as_node"] != "agent" {
			t.Errorf("update task %v", p)
		}
		raw, _ := json.Marshal(map[string]any{"checkpoint": map[string]any{"checkpoint_id": "c9"},
			"state": map[string]any{"values": p["values"], "next": []any{}, "tasks": []any{}, "checkpoint": map[string]any{"checkpoint_id": "c9"}}})
		return raw
	})
	got := a.must(200, "POST", "/threads/"+th+"/state", map[string]any{"values": map[string]any{"x": 1}, "as_node": "agent"}).Obj
	if got["checkpoint"].(map[string]any)["checkpoint_id"] != "c9" {
		t.Fatalf("update answered %v: want the runtime's checkpoint", got)
	}
	if v := a.must(200, "GET", "/threads/"+th, nil).Obj["values"].(map[string]any); v["x"] != float64(1) {
		t.Fatalf("thread values %v: want the updated state", v)
	}
	if h := a.must(200, "POST", "/threads/"+th+"/history", map[string]any{}).List; len(h) != 1 {
		t.Fatalf("history %v: want the update's state", h)
	}
}
