package agentserver_test

import (
	"strings"
	"testing"
)

func TestRegisterGraphMakesItsSystemAssistant(t *testing.T) {
	a := newAPI(t)
	a.must(404, "GET", "/assistants/agent", nil)
	reg := map[string]any{"config": map[string]any{"configurable": map[string]any{"model_name": "openai"}},
		"graph":        map[string]any{"nodes": []any{map[string]any{"id": "agent"}}, "edges": []any{}},
		"input_schema": map[string]any{"type": "object"}, "subgraphs": map[string]any{"sub": map[string]any{"graph_id": "sub"}}}
	as := a.must(200, "PUT", "/v1/agent-server/graphs/agent", reg).Obj
	if as["assistant_id"] != "fe096781-5601-53d2-b2f6-0d3403f7e9ca" || as["graph_id"] != "agent" || as["name"] != "agent" {
		t.Fatalf("registered %v: want the system assistant of graph agent, with LangGraph's uuid5 id", as)
	}
	if md, _ := as["metadata"].(map[string]any); md["created_by"] != "system" {
		t.Fatalf("metadata %v: want created_by system", as["metadata"])
	}
	if cfg, _ := as["config"].(map[string]any)["configurable"].(map[string]any); cfg["model_name"] != "openai" {
		t.Fatalf("config %v: want the registration's", as["config"])
	}
	// A second registration keeps the assistant (and an update of it).
	a.must(200, "PATCH", "/assistants/agent", map[string]any{"metadata": map[string]any{"stage": "x"}})
	again := a.must(200, "PUT", "/v1/agent-server/graphs/agent", reg).Obj
	if again["version"] != float64(2) {
		t.Fatalf("registering again answered %v: want the updated assistant kept", again)
	}
	if got := a.must(200, "GET", "/assistants/agent/schemas", nil).Obj; got["graph_id"] != "agent" || got["input_schema"] == nil {
		t.Fatalf("schemas %v", got)
	}
	if got := a.must(200, "GET", "/assistants/agent/graph", nil).Obj; len(got["nodes"].([]any)) != 1 {
		t.Fatalf("graph %v", got)
	}
	if got := a.must(200, "GET", "/assistants/agent/subgraphs", nil).Obj; got["sub"] == nil {
		t.Fatalf("subgraphs %v", got)
	}
	a.must(400, "PUT", "/v1/agent-server/graphs/agent", map[string]any{"graph_id": "other"})
	other := a.must(200, "POST", "/assistants", map[string]any{"graph_id": "nograph"}).Obj
	a.must(404, "GET", "/assistants/"+other["assistant_id"].(string)+"/schemas", nil)
}

func TestTruncateOnlyWhenAskedAndKeepsSystemAssistants(t *testing.T) {
	off := newAPI(t)
	off.must(404, "POST", "/internal/truncate", map[string]any{"threads": true})

	t.Setenv("DROVER_AGENT_SERVER_TRUNCATE", "1")
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	mine := a.must(200, "POST", "/assistants", map[string]any{"graph_id": "agent"}).Obj
	a.must(200, "POST", "/threads", map[string]any{})
	a.must(204, "POST", "/internal/truncate", map[string]any{"threads": true})
	if n := a.must(200, "POST", "/threads/count", map[string]any{}).Raw; strings.TrimSpace(n) != "0" {
		t.Fatalf("%s threads after truncate, want 0", n)
	}
	if n := a.must(200, "POST", "/assistants/count", map[string]any{}).Raw; strings.TrimSpace(n) != "2" {
		t.Fatalf("%s assistants after truncating threads only, want 2", n)
	}
	a.must(204, "POST", "/internal/truncate", map[string]any{"runs": true, "threads": true, "assistants": true, "store": true, "checkpoint": true})
	a.must(404, "GET", "/assistants/"+mine["assistant_id"].(string), nil)
	a.must(404, "POST", "/assistants/"+mine["assistant_id"].(string)+"/versions", map[string]any{})
	a.must(200, "GET", "/assistants/agent", nil)
	if n := a.must(200, "POST", "/assistants/count", map[string]any{}).Raw; strings.TrimSpace(n) != "1" {
		t.Fatalf("%s assistants after truncate, want the system one", n)
	}
}
