package agentserver_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// putItems stores n items of namespace ns directly, as the server
// stores them.
func putItems(t *testing.T, a *api, ns []string, n int, value string) {
	t.Helper()
	sp := keyspace.MustNew(a.ns)
	now := time.Now().UTC().Format(time.RFC3339Nano)
	for i := 0; i < n; {
		var ops []clientv3.Op
		for ; i < n && len(ops) < 100; i++ {
			ops = append(ops, clientv3.OpPut(sp.AgentStoreItem(ns, fmt.Sprintf("k%04d", i)),
				fmt.Sprintf(`{"value":%s,"created_at":%q,"updated_at":%q}`, value, now, now)))
		}
		if _, err := a.cli.Txn(context.Background()).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelManyReadsActiveRunsOnly: cancelling runs by status, or by
// id without their thread, reads the index of active runs, not every
// run the namespace ever had.
func TestCancelManyReadsActiveRunsOnly(t *testing.T) {
	var rc *readCounter
	a := newAPI(t, func(c *httpapi.Config) { c.Etcd, rc = countingClient(c.Etcd) })
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	const history = 30
	var ended string
	for range history {
		ended = a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		a.must(204, "POST", "/threads/"+th+"/runs/"+ended+"/cancel", nil)
	}
	prefix := keyspace.MustNew(a.ns).AgentRuns("")
	for _, body := range []map[string]any{{"status": "pending"}, {"run_ids": []string{"ID"}}} {
		id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		if body["run_ids"] != nil {
			body["run_ids"] = []string{id}
		}
		rc.n.Store(0)
		rc.prefix.Store(&prefix)
		a.must(204, "POST", "/runs/cancel", body)
		rc.prefix.Store(nil)
		if n := rc.n.Load(); n >= history {
			t.Fatalf("cancel many %v read %d run keys with %d runs ended: want those not ended only", body, n, history)
		}
		if st := a.must(200, "GET", "/threads/"+th+"/runs/"+id, nil).Obj["status"]; st != "interrupted" {
			t.Fatalf("run cancelled by %v: %v, want interrupted", body, st)
		}
	}
	// A run ended is still found by its id alone, in the runs' keys.
	a.must(204, "POST", "/runs/cancel?action=rollback", map[string]any{"run_ids": []string{ended}})
	a.must(404, "GET", "/threads/"+th+"/runs/"+ended, nil)
}

// TestStoreNamespacesReadAKeyPerNamespace: listing namespaces reads a
// page of keys of each at most, not every item; past its limit of keys
// a listing, and a search that has not filled its page, is a 400 naming
// what to narrow.
func TestStoreNamespacesReadAKeyPerNamespace(t *testing.T) {
	var rc *readCounter
	a := newAPI(t, func(c *httpapi.Config) { c.Etcd, rc = countingClient(c.Etcd) })
	const items = 200
	spaces := [][]string{{"m", "ann"}, {"m", "bob"}, {"m", "bob", "x"}, {"n"}}
	for _, ns := range spaces {
		putItems(t, a, ns, items, `{"n":1}`)
	}
	prefix := keyspace.MustNew(a.ns).AgentStore()
	rc.n.Store(0)
	rc.prefix.Store(&prefix)
	got := a.must(200, "POST", "/store/namespaces", map[string]any{}).Obj["namespaces"].([]any)
	rc.prefix.Store(nil)
	if fmt.Sprint(got) != "[[m ann] [m bob] [m bob x] [n]]" {
		t.Fatalf("namespaces %v", got)
	}
	if n := rc.n.Load(); n > int64(len(spaces)*64) {
		t.Fatalf("a listing read %d keys of %d namespaces of %d items each: want a page (64 keys) a namespace at most", n, len(spaces), items)
	}
	if got := a.must(200, "POST", "/store/namespaces", map[string]any{"max_depth": 1}).Obj["namespaces"].([]any); fmt.Sprint(got) != "[[m] [n]]" {
		t.Fatalf("namespaces cut to 1 label %v", got)
	}
	if got := a.must(200, "POST", "/store/namespaces", map[string]any{"suffix": []string{"x"}}).Obj["namespaces"].([]any); fmt.Sprint(got) != "[[m bob x]]" {
		t.Fatalf("namespaces ending in x %v", got)
	}

	defer agentserver.SetStoreScanLimit(3)()
	if ans := a.must(400, "POST", "/store/namespaces", map[string]any{}); !errorAt(ans, "body.prefix") {
		t.Fatalf("a listing past its limit: %s, want body.prefix named", ans.Raw)
	}
	a.must(200, "POST", "/store/namespaces", map[string]any{"prefix": []string{"m", "bob"}})
	if ans := a.must(400, "POST", "/store/items/search", map[string]any{"namespace_prefix": []string{"m"}, "filter": map[string]any{"n": 2}}); !errorAt(ans, "body.filter") {
		t.Fatalf("a filtered search past its limit: %s, want body.filter named", ans.Raw)
	}
	if n := len(a.must(200, "POST", "/store/items/search", map[string]any{"namespace_prefix": []string{"m"}, "limit": 3}).Obj["items"].([]any)); n != 3 {
		t.Fatalf("a search that fills its page within the limit: %d items, want 3", n)
	}
}

// TestCreateOnce: an assistant's and a thread's create are one
// function's: written once, a taken id a 409 in LangGraph's words or,
// with do_nothing, the record stored; past the store guard a 507 whether
// or not the id is taken, nothing written.
func TestCreateOnce(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	if old, err := agentserver.CreateOnceOn(ctx, a.cli, a.ns, "Thing", "things/1", `{"n":1}`, false); err != nil || old != nil {
		t.Fatalf("first create: %s %v", old, err)
	}
	if _, err := agentserver.CreateOnceOn(ctx, a.cli, a.ns, "Thing", "things/1", `{"n":2}`, false); err == nil || err.Error() != "Thing already exists: if_exists is raise (send do_nothing to get the existing one)" {
		t.Fatalf("taken, raise: %v", err)
	}
	if old, err := agentserver.CreateOnceOn(ctx, a.cli, a.ns, "Thing", "things/1", `{"n":2}`, true); err != nil || string(old) != `{"n":1}` {
		t.Fatalf("taken, do_nothing: %s %v, want the first", old, err)
	}
	for _, c := range []struct{ path, idField string }{{"/assistants", "assistant_id"}, {"/threads", "thread_id"}} {
		body := map[string]any{"graph_id": "agent", "metadata": map[string]any{"v": 1}}
		if c.path == "/threads" {
			delete(body, "graph_id")
		}
		id := a.must(200, "POST", c.path, body).Obj[c.idField].(string)
		body[c.idField], body["metadata"] = id, map[string]any{"v": 2}
		if ans := a.must(409, "POST", c.path, body); ans.Obj["detail"] == nil {
			t.Fatalf("%s taken: %s", c.path, ans.Raw)
		}
		body["if_exists"] = "do_nothing"
		if got := a.must(200, "POST", c.path, body).Obj["metadata"].(map[string]any)["v"]; got != 1.0 {
			t.Fatalf("%s taken, do_nothing: metadata v %v, want the first's", c.path, got)
		}
	}
}
