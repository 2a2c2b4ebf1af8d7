package agentserver_test

import (
	"fmt"
	"math"
	"net/http"
	"sort"
	"testing"

	"github.com/droverhq/drover/httpapi"
)

func TestThreadLifecycle(t *testing.T) {
	a := newAPI(t)
	th := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"user": "ann"}}).Obj
	id, _ := th["thread_id"].(string)
	if len(id) != 36 || th["status"] != "idle" || th["values"] != nil {
		t.Fatalf("created %v: want a UUID, idle, no values", th)
	}
	a.must(409, "POST", "/threads", map[string]any{"thread_id": id})
	if same := a.must(200, "POST", "/threads", map[string]any{"thread_id": id, "if_exists": "do_nothing", "metadata": map[string]any{"user": "bob"}}).Obj; same["metadata"].(map[string]any)["user"] != "ann" {
		t.Fatalf("do_nothing answered %v: want the thread unchanged", same)
	}
	up := a.must(200, "PATCH", "/threads/"+id, map[string]any{"metadata": map[string]any{"topic": "rust"}}).Obj
	md, _ := up["metadata"].(map[string]any)
	if md["user"] != "ann" || md["topic"] != "rust" || up["updated_at"] == th["updated_at"] && up["created_at"] != th["created_at"] {
		t.Fatalf("update answered %v: want metadata merged", up)
	}
	if got := a.must(200, "GET", "/threads/"+id, nil).Obj; fmt.Sprint(got["metadata"]) != fmt.Sprint(md) {
		t.Fatalf("get %v: want the update's metadata %v", got["metadata"], md)
	}

	cp := a.must(200, "POST", "/threads/"+id+"/copy", nil).Obj
	cmd, _ := cp["metadata"].(map[string]any)
	if cp["thread_id"] == id || cmd["thread_id"] != cp["thread_id"] || cmd["user"] != "ann" || cmd["topic"] != "rust" {
		t.Fatalf("copy %v: want a new id, the metadata and thread_id set to the new id", cp)
	}
	a.must(200, "GET", "/threads/"+cp["thread_id"].(string), nil)

	a.must(204, "DELETE", "/threads/"+id, nil)
	if ans := a.must(404, "GET", "/threads/"+id, nil); ans.Obj["detail"] != "Thread with ID "+id+" not found" {
		t.Fatalf("404 detail %q, want LangGraph's", ans.Obj["detail"])
	}
	a.must(404, "DELETE", "/threads/"+id, nil)
	a.must(404, "PATCH", "/threads/"+id, map[string]any{"metadata": map[string]any{}})
	a.must(404, "POST", "/threads/"+id+"/copy", nil)
}

func TestThreadBadInput(t *testing.T) {
	a := newAPI(t)
	for _, c := range []struct {
		name, method, path string
		body               any
		status             int
		location           string
	}{
		{"path id not a UUID", "GET", "/threads/nope", nil, 400, "path.thread_id"},
		{"body id not a UUID", "POST", "/threads", map[string]any{"thread_id": "nope"}, 400, "body.thread_id"},
		{"if_exists unknown", "POST", "/threads", map[string]any{"if_exists": "replace"}, 400, "body.if_exists"},
		{"metadata not an object", "POST", "/threads", map[string]any{"metadata": "x"}, 400, "body.metadata"},
		{"superstep without updates", "POST", "/threads", map[string]any{"supersteps": []any{map[string]any{"updates": []any{}}}}, 400, "body.supersteps[0].updates"},
		{"supersteps without a graph", "POST", "/threads", map[string]any{"supersteps": []any{map[string]any{"updates": []any{map[string]any{"values": map[string]any{}}}}}}, 400, "body.metadata.graph_id"},
		{"superstep command", "POST", "/threads", map[string]any{"metadata": map[string]any{"graph_id": "agent"},
			"supersteps": []any{map[string]any{"updates": []any{map[string]any{"command": map[string]any{"resume": 1}}}}}}, 501, "body.supersteps[0].updates[0].command"},
		{"ttl", "POST", "/threads", map[string]any{"ttl": map[string]any{"ttl": 5, "strategy": "delete"}}, 501, "body.ttl"},
		{"status unknown", "POST", "/threads/search", map[string]any{"status": "sleeping"}, 400, "body.status"},
		{"ids not UUIDs", "POST", "/threads/search", map[string]any{"ids": []any{"x"}}, 400, "body.ids[0]"},
		{"sort by unknown", "POST", "/threads/search", map[string]any{"sort_by": "name"}, 400, "body.sort_by"},
		{"huge offset", "POST", "/threads/search", map[string]any{"offset": int64(math.MaxInt64)}, 400, "body.offset"},
		{"select unknown", "POST", "/threads/search", map[string]any{"select": []any{"colour"}}, 400, "body.select[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ans := a.must(c.status, c.method, c.path, c.body)
			if ans.Header.Get("Content-Type") != "application/problem+json" || !errorAt(ans, c.location) {
				t.Fatalf("%d %s: want a problem naming %s", c.status, ans.Raw, c.location)
			}
		})
	}
	if n := a.must(200, "POST", "/threads/count", map[string]any{}).Raw; n != "0\n" && n != "0" {
		t.Fatalf("after bad inputs, %q threads are stored; want 0", n)
	}
}

func TestThreadSearch(t *testing.T) {
	a := newAPI(t)
	var ids []string
	for i := range 3 {
		th := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"n": i, "even": i%2 == 0}}).Obj
		ids = append(ids, th["thread_id"].(string))
	}
	ns := func(l []map[string]any) (out []any) {
		for _, m := range l {
			out = append(out, m["metadata"].(map[string]any)["n"])
		}
		return out
	}
	byID := []int{0, 1, 2} // the thread numbers, in the order of their ids
	sort.Slice(byID, func(i, j int) bool { return ids[byID[i]] < ids[byID[j]] })
	for _, c := range []struct {
		name string
		body map[string]any
		want string
	}{
		{"newest first", map[string]any{}, "[2 1 0]"},
		{"oldest first", map[string]any{"sort_order": "asc"}, "[0 1 2]"},
		{"by metadata", map[string]any{"metadata": map[string]any{"even": true}}, "[2 0]"},
		{"by ids", map[string]any{"ids": []any{ids[0], ids[2]}}, "[2 0]"},
		{"by status", map[string]any{"status": "busy"}, "[]"},
		{"by id ascending", map[string]any{"sort_by": "thread_id", "sort_order": "asc"}, fmt.Sprint(byID)},
		{"by values, none stored yet", map[string]any{"values": map[string]any{"messages": []any{}}}, "[]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := fmt.Sprint(ns(a.must(200, "POST", "/threads/search", c.body).List)); got != c.want {
				t.Fatalf("search %v: %s, want %s", c.body, got, c.want)
			}
		})
	}
	p := a.must(200, "POST", "/threads/search", map[string]any{"limit": 1, "offset": 1, "select": []any{"thread_id"}})
	if p.Header.Get("X-Pagination-Total") != "3" || p.Header.Get("X-Pagination-Next") != "2" || len(p.List) != 1 || len(p.List[0]) != 1 || p.List[0]["thread_id"] != ids[1] {
		t.Fatalf("page 2 of 1: headers %v, %v", p.Header, p.List)
	}
	if n := a.must(200, "POST", "/threads/count", map[string]any{"status": "idle"}).Raw; n != "3\n" && n != "3" {
		t.Fatalf("count of idle threads: %q, want 3", n)
	}
}

func TestDeleteAssistantWithItsThreads(t *testing.T) {
	a := newAPI(t)
	id := a.must(200, "POST", "/assistants", map[string]any{"graph_id": "agent"}).Obj["assistant_id"].(string)
	mine := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"assistant_id": id}}).Obj["thread_id"].(string)
	other := a.must(200, "POST", "/threads", map[string]any{"metadata": map[string]any{"assistant_id": "someone-else"}}).Obj["thread_id"].(string)
	a.must(204, "DELETE", "/assistants/"+id+"?delete_threads=true", nil)
	a.must(404, "GET", "/threads/"+mine, nil)
	a.must(200, "GET", "/threads/"+other, nil)
}

// LangGraph's clients send their key as x-api-key: drover reads it as a
// bearer token, with the token's namespaces and role.
func TestAPIKeyIsABearerToken(t *testing.T) {
	var ns string
	a := newAPI(t, func(c *httpapi.Config) {
		ns = c.Namespace
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{
			{Name: "writer", Token: "writer-secret-0123456789", Namespaces: []string{c.Namespace}, Role: "write"},
			{Name: "reader", Token: "reader-secret-0123456789", Namespaces: []string{c.Namespace}, Role: "read"},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	a.must(http.StatusUnauthorized, "POST", "/threads", map[string]any{})
	a.hdr.Set("X-Api-Key", "wrong")
	a.must(http.StatusUnauthorized, "POST", "/threads", map[string]any{})
	a.hdr.Set("X-Api-Key", "writer-secret-0123456789")
	a.must(200, "POST", "/threads", map[string]any{})
	a.hdr.Set("X-Api-Key", "reader-secret-0123456789")
	a.must(http.StatusForbidden, "POST", "/threads", map[string]any{})
	if l := a.must(200, "POST", "/threads/search", map[string]any{}).List; len(l) != 1 {
		t.Fatalf("a read token searched %d threads, want the 1 created", len(l))
	}
	a.must(200, "POST", "/assistants/search", map[string]any{})
	a.hdr.Set(httpapi.NamespaceHeader, ns+"-other")
	a.must(http.StatusForbidden, "POST", "/threads/search", map[string]any{})
}

// Namespaces keep their threads apart, as every drover resource.
func TestNamespacesKeepThreadsApart(t *testing.T) {
	var ns string
	a := newAPI(t, func(c *httpapi.Config) { ns = c.Namespace })
	id := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	a.hdr.Set(httpapi.NamespaceHeader, ns+"-other")
	a.must(404, "GET", "/threads/"+id, nil)
}
