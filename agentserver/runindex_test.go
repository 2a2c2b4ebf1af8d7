package agentserver_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
)

// TestCreateReadsNoHistory: a run's create reads the thread's active
// runs, not every run the thread ever had.
func TestCreateReadsNoHistory(t *testing.T) {
	var rc *readCounter
	a := newAPI(t, func(c *httpapi.Config) { c.Etcd, rc = countingClient(c.Etcd) })
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	const history = 30
	for range history {
		id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		a.must(204, "POST", "/threads/"+th+"/runs/"+id+"/cancel", nil)
	}
	prefix := keyspace.MustNew(a.ns).AgentRuns(th)
	rc.n.Store(0)
	rc.prefix.Store(&prefix)
	a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"})
	rc.prefix.Store(nil)
	if n := rc.n.Load(); n >= history {
		t.Fatalf("a create read %d run records of a thread with %d ended runs: want those not ended only", n, history)
	}
}

// TestAwaitAdmittedSubmitsTheTask: a run admitted whose creator died
// before submitting its task is not taken as started by a join or
// stream: their wait submits the task first.
func TestAwaitAdmittedSubmitsTheTask(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := "1f0a0000-0000-4000-8000-0000000000aa"
	strandRun(t, a, th, id, time.Now().UTC())
	r := storedRun(t, a, th, id)
	r["params"] = map[string]any{"run": map[string]any{"run_id": id, "thread_id": th}, "graph_id": "agent"}
	raw, _ := json.Marshal(r)
	if _, err := a.cli.Put(ctx, keyspace.MustNew(a.ns).AgentRun(th, id), string(raw)); err != nil {
		t.Fatal(err)
	}
	if err := agentserver.AwaitAdmitted(ctx, a.cli, a.ns, th, id); err != nil {
		t.Fatal(err)
	}
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(ctx) }()
	if _, err := q.Get(ctx, id); err != nil {
		t.Fatalf("the wait answered with the run admitted and no task: %v", err)
	}
}

// TestIndexBackfillsRunsStoredBefore: a run stored by a version that
// wrote no index key (active, its thread busy) is found by the first
// create after the upgrade: the thread refuses a second run (reject),
// and the run has its index key.
func TestIndexBackfillsRunsStoredBefore(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	sp := keyspace.MustNew(a.ns)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := "1f0a0000-0000-4000-8000-0000000000b1"
	strandRun(t, a, th, id, time.Now().UTC())
	if _, err := a.cli.Delete(ctx, sp.AgentActiveRun(th, id)); err != nil { // as the earlier version stored it
		t.Fatal(err)
	}
	a.must(409, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "multitask_strategy": "reject"})
	got, err := a.cli.Get(ctx, sp.AgentActiveRun(th, id))
	if err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the stored run's index key after the backfill: %v (%d keys)", err, len(got.Kvs))
	}
	if got, err := a.cli.Get(ctx, sp.AgentActiveRunsIndexed()); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("the namespace's backfill mark: %v", err)
	}
}

// TestStaleIndexKeyLeavesThreadIdle: an index key whose run is gone does
// not keep its thread busy once the thread's last run ends.
func TestStaleIndexKeyLeavesThreadIdle(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := "1f0a0000-0000-4000-8000-0000000000b2"
	strandRun(t, a, th, id, time.Now().UTC())
	if _, err := a.cli.Put(ctx, keyspace.MustNew(a.ns).AgentActiveRun(th, "1f0a0000-0000-4000-8000-0000000000b3"), ""); err != nil {
		t.Fatal(err)
	}
	a.must(204, "POST", "/threads/"+th+"/runs/"+id+"/cancel", nil)
	if got := a.must(200, "GET", "/threads/"+th, nil).Obj; got["status"] != "idle" {
		t.Fatalf("thread %v with a stale index key: want idle once its run is cancelled", got["status"])
	}
}

// TestAwaitAdmittedLeavesAnOldRun: a run admitted long ago (past the
// grace) whose task is gone has ended, its task dropped by the queue's
// retention: a wait does not submit its task again, which would run the
// graph a second time.
func TestAwaitAdmittedLeavesAnOldRun(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	id := "1f0a0000-0000-4000-8000-0000000000b4"
	strandRun(t, a, th, id, time.Now().UTC().Add(-time.Hour))
	r := storedRun(t, a, th, id)
	r["params"] = map[string]any{"run": map[string]any{"run_id": id, "thread_id": th}, "graph_id": "agent"}
	raw, _ := json.Marshal(r)
	if _, err := a.cli.Put(ctx, keyspace.MustNew(a.ns).AgentRun(th, id), string(raw)); err != nil {
		t.Fatal(err)
	}
	if err := agentserver.AwaitAdmitted(ctx, a.cli, a.ns, th, id); err != nil {
		t.Fatal(err)
	}
	q, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = q.Close(ctx) }()
	if _, err := q.Get(ctx, id); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("the task of a run admitted an hour ago, after a wait: %v, want none submitted again", err)
	}
}
