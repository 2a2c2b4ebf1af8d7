package agentserver_test

import (
	"fmt"
	"math"
	"net/http"
	"sync"
	"testing"
)

func TestAssistantVersions(t *testing.T) {
	a := newAPI(t)
	created := a.must(200, "POST", "/assistants", map[string]any{
		"graph_id": "agent", "config": map[string]any{"configurable": map[string]any{"model_name": "gpt"}},
		"metadata": map[string]any{"owner": "ann"}, "description": "foo"}).Obj
	id, _ := created["assistant_id"].(string)
	if created["version"] != 1.0 || created["name"] != "agent" || created["description"] != "foo" || len(id) != 36 {
		t.Fatalf("created %v: want version 1, the graph's name, the description and a UUID", created)
	}
	got := a.must(200, "GET", "/assistants/"+id, nil).Obj
	if got["graph_id"] != "agent" || got["created_at"] != created["created_at"] {
		t.Fatalf("get %v: want what was created %v", got, created)
	}

	v2 := a.must(200, "PATCH", "/assistants/"+id, map[string]any{"metadata": map[string]any{"name": "woof"}, "description": "bar"}).Obj
	md, _ := v2["metadata"].(map[string]any)
	if v2["version"] != 2.0 || md["owner"] != "ann" || md["name"] != "woof" || v2["description"] != "bar" {
		t.Fatalf("update answered %v: want version 2, metadata merged, description replaced", v2)
	}
	vs := a.must(200, "POST", "/assistants/"+id+"/versions", map[string]any{}).List
	if len(vs) != 2 || vs[0]["version"] != 2.0 || vs[1]["version"] != 1.0 {
		t.Fatalf("versions %v: want 2 then 1", vs)
	}
	if vs := a.must(200, "POST", "/assistants/"+id+"/versions", map[string]any{"metadata": map[string]any{"name": "woof"}}).List; len(vs) != 1 {
		t.Fatalf("versions whose metadata has name woof: %d, want 1", len(vs))
	}

	back := a.must(200, "POST", "/assistants/"+id+"/latest", map[string]any{"version": 1}).Obj
	md, _ = back["metadata"].(map[string]any)
	if back["version"] != 1.0 || md["name"] != nil || back["description"] != "foo" {
		t.Fatalf("set latest 1 answered %v: want version 1's fields", back)
	}
	if got := a.must(200, "GET", "/assistants/"+id, nil).Obj; got["version"] != 1.0 {
		t.Fatalf("after set latest 1, get says version %v", got["version"])
	}
	// An update after going back makes a new version, not a second 2.
	if v3 := a.must(200, "PATCH", "/assistants/"+id, map[string]any{"name": "renamed"}).Obj; v3["version"] != 3.0 || v3["name"] != "renamed" {
		t.Fatalf("update after set latest: %v, want version 3 named renamed", v3)
	}
	a.must(404, "POST", "/assistants/"+id+"/latest", map[string]any{"version": 9})

	a.must(204, "DELETE", "/assistants/"+id, nil)
	if ans := a.must(404, "GET", "/assistants/"+id, nil); ans.Obj["detail"] != "Assistant not found" {
		t.Fatalf("404 detail %q, want LangGraph's Assistant not found", ans.Obj["detail"])
	}
	a.must(404, "POST", "/assistants/"+id+"/versions", map[string]any{})
	a.must(404, "DELETE", "/assistants/"+id, nil)
}

func TestAssistantIDTaken(t *testing.T) {
	a := newAPI(t)
	const id = "0b7a3c4e-1f2a-4b5c-8d9e-0123456789ab"
	first := a.must(200, "POST", "/assistants", map[string]any{"assistant_id": id, "graph_id": "agent", "name": "first"}).Obj
	a.must(409, "POST", "/assistants", map[string]any{"assistant_id": id, "graph_id": "other"})
	same := a.must(200, "POST", "/assistants", map[string]any{"assistant_id": id, "graph_id": "other", "name": "second", "if_exists": "do_nothing"}).Obj
	if same["name"] != "first" || same["graph_id"] != "agent" || same["created_at"] != first["created_at"] {
		t.Fatalf("do_nothing answered %v: want the first assistant unchanged", same)
	}
}

// A graph's name stands for the assistant its runtime registers, whose id
// is LangGraph's uuid5(NAMESPACE_GRAPH, name) (computed here by Python's
// uuid module).
func TestGraphNameStandsForItsAssistant(t *testing.T) {
	a := newAPI(t)
	a.must(404, "GET", "/assistants/agent", nil)
	a.must(200, "POST", "/assistants", map[string]any{"assistant_id": "fe096781-5601-53d2-b2f6-0d3403f7e9ca", "graph_id": "agent"})
	if got := a.must(200, "GET", "/assistants/agent", nil).Obj; got["assistant_id"] != "fe096781-5601-53d2-b2f6-0d3403f7e9ca" {
		t.Fatalf("GET /assistants/agent answered %v", got)
	}
}

func TestAssistantBadInput(t *testing.T) {
	a := newAPI(t)
	for _, c := range []struct {
		name, method, path string
		body               any
		location           string
	}{
		{"no graph", "POST", "/assistants", map[string]any{"name": "x"}, "body.graph_id"},
		{"empty graph", "POST", "/assistants", map[string]any{"graph_id": ""}, "body.graph_id"},
		{"id not a UUID", "POST", "/assistants", map[string]any{"graph_id": "agent", "assistant_id": "nope"}, "body.assistant_id"},
		{"if_exists unknown", "POST", "/assistants", map[string]any{"graph_id": "agent", "if_exists": "update"}, "body.if_exists"},
		{"config not an object", "POST", "/assistants", map[string]any{"graph_id": "agent", "config": 3}, "body.config"},
		{"unknown field", "POST", "/assistants", map[string]any{"graph_id": "agent", "graph": "x"}, "body.graph"},
		{"limit 0", "POST", "/assistants/search", map[string]any{"limit": 0}, "body.limit"},
		{"limit over 1000", "POST", "/assistants/search", map[string]any{"limit": 1001}, "body.limit"},
		{"negative offset", "POST", "/assistants/search", map[string]any{"offset": -1}, "body.offset"},
		{"huge offset", "POST", "/assistants/search", map[string]any{"offset": int64(math.MaxInt64)}, "body.offset"},
		{"huge versions offset", "POST", "/assistants/agent/versions", map[string]any{"offset": int64(math.MaxInt64)}, "body.offset"},
		{"select unknown", "POST", "/assistants/search", map[string]any{"select": []any{"assistant_id", "colour"}}, "body.select[1]"},
		{"patch blank graph", "PATCH", "/assistants/agent", map[string]any{"graph_id": " "}, "body.graph_id"},
		{"patch empty graph", "PATCH", "/assistants/agent", map[string]any{"graph_id": ""}, "body.graph_id"},
		{"sort by unknown", "POST", "/assistants/search", map[string]any{"sort_by": "color"}, "body.sort_by"},
		{"version 0", "POST", "/assistants/agent/latest", map[string]any{"version": 0}, "body.version"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ans := a.must(http.StatusBadRequest, c.method, c.path, c.body)
			if ans.Header.Get("Content-Type") != "application/problem+json" || !errorAt(ans, c.location) {
				t.Fatalf("400 %s %s: want a problem naming %s", ans.Header.Get("Content-Type"), ans.Raw, c.location)
			}
		})
	}
	if n := a.must(200, "POST", "/assistants/count", map[string]any{}).Raw; n != "0\n" && n != "0" {
		t.Fatalf("after bad inputs, %q assistants are stored; want 0", n)
	}
}

func TestAssistantSearch(t *testing.T) {
	a := newAPI(t)
	for i, c := range []struct{ graph, name, team string }{{"agent", "alpha", "red"}, {"agent", "beta", "blue"}, {"weather", "Gamma", "red"}} {
		a.must(200, "POST", "/assistants", map[string]any{"graph_id": c.graph, "name": c.name,
			"metadata": map[string]any{"team": c.team, "n": i, "tags": []any{"x", c.team}}})
	}
	names := func(l []map[string]any) (out []any) {
		for _, m := range l {
			out = append(out, m["name"])
		}
		return out
	}
	for _, c := range []struct {
		name string
		body map[string]any
		want string
	}{
		{"newest first", map[string]any{}, "[Gamma beta alpha]"},
		{"by graph", map[string]any{"graph_id": "agent"}, "[beta alpha]"},
		{"by metadata", map[string]any{"metadata": map[string]any{"team": "red"}}, "[Gamma alpha]"},
		{"by number", map[string]any{"metadata": map[string]any{"n": 1}}, "[beta]"},
		{"by array element", map[string]any{"metadata": map[string]any{"tags": []any{"blue"}}}, "[beta]"},
		{"name ignoring case", map[string]any{"name": "GAM"}, "[Gamma]"},
		{"by name ascending", map[string]any{"sort_by": "name", "sort_order": "asc"}, "[Gamma alpha beta]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := fmt.Sprint(names(a.must(200, "POST", "/assistants/search", c.body).List)); got != c.want {
				t.Fatalf("search %v: %s, want %s", c.body, got, c.want)
			}
		})
	}
	p := a.must(200, "POST", "/assistants/search", map[string]any{"limit": 2, "select": []any{"name", "version"}})
	if p.Header.Get("X-Pagination-Total") != "3" || p.Header.Get("X-Pagination-Next") != "2" || len(p.List) != 2 || len(p.List[0]) != 2 {
		t.Fatalf("page 1: headers %v, %v: want total 3, next 2 and two fields each", p.Header, p.List)
	}
	p = a.must(200, "POST", "/assistants/search", map[string]any{"limit": 2, "offset": 2})
	if p.Header.Get("X-Pagination-Next") != "" || len(p.List) != 1 {
		t.Fatalf("last page: next %q, %d items: want none and 1", p.Header.Get("X-Pagination-Next"), len(p.List))
	}
	if n := a.must(200, "POST", "/assistants/count", map[string]any{"graph_id": "agent"}).Raw; n != "2\n" && n != "2" {
		t.Fatalf("count of graph agent: %q, want 2", n)
	}
}

// Concurrent updates each make a version: none is lost.
func TestConcurrentUpdatesLoseNoVersion(t *testing.T) {
	a := newAPI(t)
	id := a.must(200, "POST", "/assistants", map[string]any{"graph_id": "agent"}).Obj["assistant_id"].(string)
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			a.must(200, "PATCH", "/assistants/"+id, map[string]any{"metadata": map[string]any{fmt.Sprint("k", i): i}})
		})
	}
	wg.Wait()
	got := a.must(200, "GET", "/assistants/"+id, nil).Obj
	md, _ := got["metadata"].(map[string]any)
	if got["version"] != float64(n+1) || len(md) != n {
		t.Fatalf("after %d concurrent updates: version %v, metadata %v; want version %d and every key", n, got["version"], md, n+1)
	}
	if vs := a.must(200, "POST", "/assistants/"+id+"/versions", map[string]any{"limit": 100}).List; len(vs) != n+1 {
		t.Fatalf("%d versions, want %d", len(vs), n+1)
	}
}
