package agentserver_test

import (
	"testing"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
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
