package agentserver_test

import (
	"context"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
)

// getItem is GET /store/items of ns and key: the item, or nil.
func getItem(a *api, ns []string, key string) map[string]any {
	a.t.Helper()
	q := url.Values{"namespace": {strings.Join(ns, ".")}, "key": {key}}
	ans := a.must(200, "GET", "/store/items?"+q.Encode(), nil)
	if strings.TrimSpace(ans.Raw) == "null" {
		return nil
	}
	return ans.Obj
}

func putItem(a *api, ns []string, key string, value map[string]any) {
	a.t.Helper()
	a.must(204, "PUT", "/store/items", map[string]any{"namespace": ns, "key": key, "value": value})
}

func searchKeys(a *api, body map[string]any) []string {
	a.t.Helper()
	items, _ := a.must(200, "POST", "/store/items/search", body).Obj["items"].([]any)
	keys := []string{}
	for _, it := range items {
		m := it.(map[string]any)
		keys = append(keys, fmt.Sprintf("%v:%v", m["namespace"], m["key"]))
	}
	return keys
}

// TestStoreItems: put, get, replace, delete as the SDK's StoreClient
// calls them; a replacement keeps created_at and moves updated_at on even
// within one millisecond.
func TestStoreItems(t *testing.T) {
	a := newAPI(t)
	ns := []string{"users", "ann/b%c", "é"}
	if got := getItem(a, ns, "k"); got != nil {
		t.Fatalf("missing item: %v, want null", got)
	}
	putItem(a, ns, "k", map[string]any{"n": 1, "deep": map[string]any{"x": []any{1, 2}}})
	first := getItem(a, ns, "k")
	if !reflect.DeepEqual(first["namespace"], []any{"users", "ann/b%c", "é"}) || first["key"] != "k" ||
		!reflect.DeepEqual(first["value"], map[string]any{"n": 1.0, "deep": map[string]any{"x": []any{1.0, 2.0}}}) {
		t.Fatalf("item: %v", first)
	}
	putItem(a, ns, "k", map[string]any{"n": 2})
	second := getItem(a, ns, "k")
	if second["created_at"] != first["created_at"] || !reflect.DeepEqual(second["value"], map[string]any{"n": 2.0}) {
		t.Fatalf("replaced: %v, first %v", second, first)
	}
	t1, _ := time.Parse(time.RFC3339Nano, first["updated_at"].(string))
	t2, _ := time.Parse(time.RFC3339Nano, second["updated_at"].(string))
	if !t2.After(t1) {
		t.Fatalf("updated_at %v then %v: not later", t1, t2)
	}
	a.must(204, "DELETE", "/store/items", map[string]any{"namespace": ns, "key": "k"})
	if got := getItem(a, ns, "k"); got != nil {
		t.Fatalf("deleted item: %v", got)
	}
	a.must(204, "DELETE", "/store/items", map[string]any{"namespace": ns, "key": "k"}) // gone already: no error
}

// TestStoreSearchAndNamespaces: search by namespace prefix (not a
// sibling that starts alike), filter, offset and limit; namespaces by
// prefix, suffix and depth.
func TestStoreSearchAndNamespaces(t *testing.T) {
	t.Setenv("DROVER_AGENT_SERVER_TRUNCATE", "1")
	a := newAPI(t)
	putItem(a, []string{"a"}, "1", map[string]any{"kind": "x", "n": 1, "tags": []any{"p", "q"}})
	putItem(a, []string{"a", "b"}, "2", map[string]any{"kind": "y", "n": 2})
	putItem(a, []string{"a", "b", "c"}, "3", map[string]any{"kind": "x", "n": 3})
	putItem(a, []string{"ab"}, "4", map[string]any{"kind": "x", "n": 4})
	for _, c := range []struct {
		body map[string]any
		want []string
	}{
		{map[string]any{"namespace_prefix": []string{"a"}}, []string{"[a]:1", "[a b]:2", "[a b c]:3"}},
		{map[string]any{"namespace_prefix": []string{"a", "b"}}, []string{"[a b]:2", "[a b c]:3"}},
		{map[string]any{}, []string{"[a]:1", "[a b]:2", "[a b c]:3", "[ab]:4"}},
		{map[string]any{"filter": map[string]any{"kind": "x"}}, []string{"[a]:1", "[a b c]:3", "[ab]:4"}},
		{map[string]any{"filter": map[string]any{"tags": []any{"q"}}}, []string{"[a]:1"}},
		{map[string]any{"filter": map[string]any{"n": map[string]any{"$gt": 1, "$lte": 3}}}, []string{"[a b]:2", "[a b c]:3"}},
		{map[string]any{"filter": map[string]any{"n": map[string]any{"$in": []any{1, 4}}}}, []string{"[a]:1", "[ab]:4"}},
		{map[string]any{"filter": map[string]any{"kind": map[string]any{"$ne": "x"}}}, []string{"[a b]:2"}},
		{map[string]any{"offset": 1, "limit": 2}, []string{"[a b]:2", "[a b c]:3"}},
		{map[string]any{"namespace_prefix": []string{"zz"}}, []string{}},
	} {
		if got := searchKeys(a, c.body); !reflect.DeepEqual(got, c.want) {
			t.Errorf("search %v: %v, want %v", c.body, got, c.want)
		}
	}
	for _, c := range []struct {
		body map[string]any
		want string
	}{
		{map[string]any{}, `[["a"],["a","b"],["a","b","c"],["ab"]]`},
		{map[string]any{"prefix": []string{"a"}}, `[["a"],["a","b"],["a","b","c"]]`},
		{map[string]any{"prefix": []string{"*", "b"}}, `[["a","b"],["a","b","c"]]`},
		{map[string]any{"suffix": []string{"b"}}, `[["a","b"]]`},
		{map[string]any{"max_depth": 1}, `[["a"],["ab"]]`},
		{map[string]any{"limit": 1, "offset": 1}, `[["a","b"]]`},
	} {
		got := a.must(200, "POST", "/store/namespaces", c.body).Raw
		if !strings.Contains(got, `"namespaces":`+c.want) {
			t.Errorf("namespaces %v: %s, want %s", c.body, got, c.want)
		}
	}
	a.must(204, "POST", "/internal/truncate", map[string]any{"store": true})
	if got := searchKeys(a, map[string]any{}); len(got) != 0 {
		t.Fatalf("after truncate: %v", got)
	}
	if got := a.must(200, "POST", "/store/namespaces", map[string]any{}).Raw; !strings.Contains(got, `"namespaces":[]`) {
		t.Fatalf("namespaces after truncate: %s", got)
	}
}

// TestStoreBadInput: each bad input is a problem naming the field and
// the rule, and stores nothing.
func TestStoreBadInput(t *testing.T) {
	a := newAPI(t)
	big := map[string]any{"s": strings.Repeat("x", 256<<10)}
	long := make([]string, 17)
	for i := range long {
		long[i] = "l"
	}
	before := keyCount(t, a)
	for _, c := range []struct {
		name, method, path string
		body               map[string]any
		status             int
		field              string
	}{
		{"no namespace", "PUT", "/store/items", map[string]any{"namespace": []string{}, "key": "k", "value": map[string]any{}}, 400, "body.namespace"},
		{"empty label", "PUT", "/store/items", map[string]any{"namespace": []string{"a", ""}, "key": "k", "value": map[string]any{}}, 400, "body.namespace[1]"},
		{"dotted label", "PUT", "/store/items", map[string]any{"namespace": []string{"a.b"}, "key": "k", "value": map[string]any{}}, 400, "body.namespace[0]"},
		{"reserved label", "PUT", "/store/items", map[string]any{"namespace": []string{"langgraph", "x"}, "key": "k", "value": map[string]any{}}, 400, "body.namespace[0]"},
		{"too many labels", "PUT", "/store/items", map[string]any{"namespace": long, "key": "k", "value": map[string]any{}}, 400, "body.namespace"},
		{"long label", "PUT", "/store/items", map[string]any{"namespace": []string{strings.Repeat("l", 257)}, "key": "k", "value": map[string]any{}}, 400, "body.namespace[0]"},
		{"empty key", "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": "", "value": map[string]any{}}, 400, "body.key"},
		{"long key", "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": strings.Repeat("k", 1025), "value": map[string]any{}}, 400, "body.key"},
		{"value not an object", "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": []any{1}}, 400, "body.value"},
		{"oversize value", "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": big}, 413, "body.value"},
		{"ttl", "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": map[string]any{}, "ttl": 5}, 501, "body.ttl"},
		{"index fields", "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": map[string]any{}, "index": []string{"x"}}, 501, "body.index"},
		{"get without namespace", "GET", "/store/items?key=k", nil, 400, "query.namespace"},
		{"get empty label", "GET", "/store/items?namespace=a..b&key=k", nil, 400, "query.namespace[1]"},
		{"get without key", "GET", "/store/items?namespace=a", nil, 400, "query.key"},
		{"delete dotted label", "DELETE", "/store/items", map[string]any{"namespace": []string{"a.b"}, "key": "k"}, 400, "body.namespace[0]"},
		{"search limit", "POST", "/store/items/search", map[string]any{"limit": 1001}, 400, "body.limit"},
		{"search negative offset", "POST", "/store/items/search", map[string]any{"offset": -1}, 400, "body.offset"},
		{"search empty label", "POST", "/store/items/search", map[string]any{"namespace_prefix": []string{""}}, 400, "body.namespace_prefix[0]"},
		{"search query", "POST", "/store/items/search", map[string]any{"query": "cats"}, 501, "body.query"},
		{"search unknown operator", "POST", "/store/items/search", map[string]any{"filter": map[string]any{"n": map[string]any{"$near": 1}}}, 400, "body.filter.n.$near"},
		{"namespaces limit", "POST", "/store/namespaces", map[string]any{"limit": 100000}, 400, "body.limit"},
		{"namespaces depth", "POST", "/store/namespaces", map[string]any{"max_depth": 0}, 400, "body.max_depth"},
		{"namespaces dotted suffix", "POST", "/store/namespaces", map[string]any{"suffix": []string{"a.b"}}, 400, "body.suffix[0]"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ans := a.must(c.status, c.method, c.path, c.body)
			if ans.Header.Get("Content-Type") != "application/problem+json" || !errorAt(ans, c.field) {
				t.Fatalf("not a problem naming %s: %v %s", c.field, ans.Header.Get("Content-Type"), ans.Raw)
			}
		})
	}
	if n := keyCount(t, a); n != before {
		t.Fatalf("bad input changed the keys: %d, then %d", before, n)
	}
}

// TestStorePutStoreFull: past the high-water mark a put is a 507 with
// Retry-After and writes nothing; reads still answer.
func TestStorePutStoreFull(t *testing.T) {
	a := newAPI(t)
	putItem(a, []string{"a"}, "k", map[string]any{"v": 1})
	keys := keyspace.MustNew(a.ns)
	if err := storeguard.Set(context.Background(), a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	ans := a.must(507, "PUT", "/store/items", map[string]any{"namespace": []string{"a"}, "key": "k", "value": map[string]any{"v": 2}})
	if ans.Header.Get("Retry-After") == "" {
		t.Fatalf("507 without Retry-After: %v", ans.Header)
	}
	if got := getItem(a, []string{"a"}, "k"); !reflect.DeepEqual(got["value"], map[string]any{"v": 1.0}) {
		t.Fatalf("item after a refused put: %v", got)
	}
}
