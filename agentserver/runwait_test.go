package agentserver_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/queue"
)

// TestWaitWakesOnTheOutcome: a wait answers when the outcome writes the
// run's record ended, without reading the run's task: a run created by
// the wait reads it never, a join of an existing run only in the read
// that answers 404 for a run not there, before the wait.
// The task check is an hour away, so a wait that missed the record's
// change would not answer within the test.
func TestWaitWakesOnTheOutcome(t *testing.T) {
	defer agentserver.SetRunTaskCheck(time.Hour)()
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		r := p["run"].(map[string]any)
		in := r["kwargs"].(map[string]any)["input"]
		ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{"in": in})})
		if ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	before := agentserver.TaskChecks()
	if got := a.must(200, "POST", "/threads/"+th+"/runs/wait", map[string]any{"assistant_id": "agent", "input": 1}).Obj; got["in"] != float64(1) {
		t.Fatalf("wait answered %v: want the run's values", got)
	}
	if n := agentserver.TaskChecks() - before; n != 0 {
		t.Fatalf("a wait that created its run read its task %d times, want 0", n)
	}
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "input": 2}).Obj["run_id"].(string)
	before = agentserver.TaskChecks()
	if got := a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/join", nil).Obj; got["in"] != float64(2) {
		t.Fatalf("join answered %v: want the run's values", got)
	}
	if n := agentserver.TaskChecks() - before; n != 0 {
		t.Fatalf("a join's wait read the run's task %d times, want 0", n)
	}
}

// TestWaitSettlesARunWhoseTaskDied: a runtime that fails the run's task
// for good without an outcome leaves the run's record as it was; the
// wait's read of the task finds it dead and answers the run's error.
func TestWaitSettlesARunWhoseTaskDied(t *testing.T) {
	defer agentserver.SetRunTaskCheck(20 * time.Millisecond)()
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	ctx, cancel := context.WithCancel(context.Background())
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: agentserver.RunsQueue, Concurrency: 1, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) {
		return nil, queue.Permanent(errors.New("the graph broke"))
	})
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		cctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
		defer stop()
		_ = w.Close(cctx)
	}()
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	got := a.must(200, "POST", "/threads/"+th+"/runs/wait", map[string]any{"assistant_id": "agent", "input": 1}).Obj
	e, ok := got["__error__"].(map[string]any)
	if !ok || e["error"] != "RunError" {
		t.Fatalf("wait on a run whose task died answered %v: want its __error__", got)
	}
	id := a.must(200, "GET", "/threads/"+th+"/runs", nil).List[0]["run_id"].(string)
	if r := storedRun(t, a, th, id); r["ended"] != true || r["status"] != "error" {
		t.Fatalf("run stored %v: want ended in error", r)
	}
}

// TestWaitWakesAfterACompaction: a run whose record was written before
// the store's last compaction is still waited for on its record: the
// watch starts at the read's revision, not the record's own.
func TestWaitWakesAfterACompaction(t *testing.T) {
	defer agentserver.SetRunTaskCheck(time.Hour)()
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	release := make(chan struct{})
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		select {
		case <-release:
		case <-ctx.Done():
			return nil
		}
		r := p["run"].(map[string]any)
		ans := a.do("PUT", fmt.Sprintf("/v1/agent-server/threads/%s/runs/%s/outcome", r["thread_id"], r["run_id"]),
			map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{"done": true})})
		if ans.Status != 200 {
			t.Errorf("outcome: %d %s", ans.Status, ans.Raw)
		}
		return nil
	})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	ctx := context.Background()
	var rev int64
	for i := range 3 { // the store moves on past the run's record
		resp, err := a.cli.Put(ctx, fmt.Sprintf("/filler/%d", i), "x")
		if err != nil {
			t.Fatal(err)
		}
		rev = resp.Header.Revision
	}
	if _, err := a.cli.Compact(ctx, rev); err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(100 * time.Millisecond) // the join is likely waiting by then; it answers either way
		close(release)
	}()
	if got := a.must(200, "GET", "/threads/"+th+"/runs/"+id+"/join", nil).Obj; got["done"] != true {
		t.Fatalf("join answered %v: want the run's values", got)
	}
}
