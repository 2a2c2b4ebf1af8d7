package httpapi_test

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
)

// threadIDs returns thread/checkpoint_ns/checkpoint_id of each item of a
// list answer, in order ("" namespaces left out).
func threadIDs(r resp) string {
	var out []string
	for _, c := range r.List {
		m := c.(map[string]any)
		id := m["thread_id"].(string) + "/"
		if ns := m["checkpoint_ns"].(string); ns != "" {
			id += ns + "/"
		}
		out = append(out, id+m["checkpoint_id"].(string))
	}
	return strings.Join(out, ",")
}

// TestCheckpointListEveryThread: GET /v1/checkpoints is LangGraph's list
// without a thread_id: every thread, in key order (thread id then "/",
// bytewise: "t-a-x" before "t-a"), each newest first; checkpoint_ns absent
// is every namespace, present (even empty) is that one; before compares
// ids across threads, limit counts across threads, filter as on a thread's
// list; each item names its thread and carries its pending writes. Bad
// input is a 400 and writes nothing.
func TestCheckpointListEveryThread(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	if l := a.do("GET", "/v1/checkpoints", nil).want(t, 200); string(l.Raw) != "[]\n" && string(l.Raw) != "[]" {
		t.Fatalf("no thread yet: %q", l.Raw)
	}
	n := 0
	for _, src := range []string{"input", "loop"} {
		for _, th := range []string{"t-b", "t-a", "t-a-x"} {
			for _, ns := range []string{"", "child|1"} {
				n++
				a.put(th, map[string]any{"checkpoint_ns": ns, "checkpoint_id": fmt.Sprintf("id-%02d", n), "mode": "append",
					"state": b64(th), "metadata": map[string]any{"source": src}}).want(t, 201)
			}
		}
	}
	a.do("POST", "/v1/threads/t-a/checkpoints/id-03/writes", map[string]any{"task_id": "t", "writes": []map[string]any{{"channel": "c", "value": b64("v")}}}).want(t, 204)
	child := url.QueryEscape("child|1")
	for q, want := range map[string]string{
		"": "t-a-x/child|1/id-12,t-a-x/id-11,t-a-x/child|1/id-06,t-a-x/id-05," +
			"t-a/child|1/id-10,t-a/id-09,t-a/child|1/id-04,t-a/id-03," +
			"t-b/child|1/id-08,t-b/id-07,t-b/child|1/id-02,t-b/id-01",
		"?checkpoint_ns=":                            "t-a-x/id-11,t-a-x/id-05,t-a/id-09,t-a/id-03,t-b/id-07,t-b/id-01",
		"?checkpoint_ns=" + child:                    "t-a-x/child|1/id-12,t-a-x/child|1/id-06,t-a/child|1/id-10,t-a/child|1/id-04,t-b/child|1/id-08,t-b/child|1/id-02",
		"?limit=3":                                   "t-a-x/child|1/id-12,t-a-x/id-11,t-a-x/child|1/id-06",
		"?limit=5&checkpoint_ns=":                    "t-a-x/id-11,t-a-x/id-05,t-a/id-09,t-a/id-03,t-b/id-07",
		"?before=id-04":                              "t-a/id-03,t-b/child|1/id-02,t-b/id-01",
		"?before=id-09&checkpoint_ns=&limit=3":       "t-a-x/id-05,t-a/id-03,t-b/id-07",
		"?filter=source=input":                       "t-a-x/child|1/id-06,t-a-x/id-05,t-a/child|1/id-04,t-a/id-03,t-b/child|1/id-02,t-b/id-01",
		`?filter=source="loop"&filter=step=1`:        "",
		"?filter=source=loop&checkpoint_ns=&limit=2": "t-a-x/id-11,t-a/id-09",
		"?before=id-01":                              "",
	} {
		l := a.do("GET", "/v1/checkpoints"+q, nil).want(t, 200)
		if got := threadIDs(l); got != want || l.List == nil {
			t.Errorf("list%s:\n got %s\nwant %s", q, got, want)
		}
	}
	l := a.do("GET", "/v1/checkpoints?before=id-04&limit=1", nil).want(t, 200)
	if m := l.List[0].(map[string]any); len(m["pending_writes"].([]any)) != 1 || m["state"] != b64("t-a") || m["metadata"].(map[string]any)["source"] != "input" {
		t.Fatalf("an item of the list: %s", l.Raw)
	}
	before := a.keyCount()
	for _, q := range []string{"checkpoint_ns=%00", "checkpoint_ns=%ff", "before=a*b", "before=" + strings.Repeat("i", 129),
		"limit=1001", "limit=-1", "limit=x", "filter==1", "filter=source", "checkpoint_ns=" + strings.Repeat("n", 1025)} {
		a.do("GET", "/v1/checkpoints?"+q, nil).problem(t, 400)
	}
	if n := a.keyCount(); n != before {
		t.Fatalf("bad lists changed the keys: %d, then %d", before, n)
	}
	for _, th := range []string{"t-b", "t-a", "t-a-x"} {
		a.do("DELETE", "/v1/threads/"+th, nil).want(t, 204)
	}
	if l := a.do("GET", "/v1/checkpoints", nil).want(t, 200); len(l.List) != 0 {
		t.Fatalf("after deleting every thread: %s", l.Raw)
	}
}

// TestCheckpointPutWithParentWrites: a put's parent_writes are saved on its
// parent, as the writes route saves them, before the checkpoint; without a
// parent, or on a parent that does not exist, nothing is written; nor by a
// put refused by compare-and-swap: the writes go with the checkpoint or not
// at all.
func TestCheckpointPutWithParentWrites(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	first := a.put("pw", map[string]any{"checkpoint_id": "c1", "state": b64("s0")}).want(t, 201).str("checkpoint_id")
	tw := []map[string]any{{"task_id": "t2", "writes": []map[string]any{{"channel": "b", "value": b64("2")}}},
		{"task_id": "t1", "writes": []map[string]any{{"channel": "a", "value": b64("1")}, {"channel": "__error__", "idx": -1}}}}
	before := a.keyCount()
	a.put("pw", map[string]any{"checkpoint_id": "c2", "state": b64("s1"), "parent_writes": tw}).problem(t, 400)
	a.put("pw", map[string]any{"checkpoint_id": "c2", "parent_checkpoint_id": "c0", "mode": "append", "state": b64("s1"), "parent_writes": tw}).problem(t, 404)
	if n := a.keyCount(); n != before {
		t.Fatalf("refused puts changed the keys: %d, then %d", before, n)
	}
	a.put("pw", map[string]any{"checkpoint_id": "c2", "parent_checkpoint_id": first, "state": b64("s1"), "parent_writes": tw}).want(t, 201)
	g := a.do("GET", "/v1/threads/pw/checkpoints/"+first, nil).want(t, 200)
	ws := g.JSON["pending_writes"].([]any)
	if len(ws) != 3 || ws[0].(map[string]any)["task_id"] != "t1" || ws[1].(map[string]any)["idx"].(float64) != 0 || ws[2].(map[string]any)["channel"] != "b" {
		t.Fatalf("the parent's writes: %s", g.Raw)
	}
	if h := a.do("GET", "/v1/threads/pw/head", nil).want(t, 200); h.str("checkpoint_id") != "c2" || len(h.JSON["pending_writes"].([]any)) != 0 {
		t.Fatalf("the head: %s", h.Raw)
	}
	more := []map[string]any{{"task_id": "t3", "writes": []map[string]any{{"channel": "c", "value": b64("3")}}}}
	before = a.keyCount()
	a.put("pw", map[string]any{"checkpoint_id": "c3", "parent_checkpoint_id": first, "state": b64("s2"), "parent_writes": more}).problem(t, 409)
	if g := a.do("GET", "/v1/threads/pw/checkpoints/"+first, nil).want(t, 200); len(g.JSON["pending_writes"].([]any)) != 3 || a.keyCount() != before {
		t.Fatalf("the writes of a put refused by compare-and-swap: %s", g.Raw)
	}
}

// TestCheckpointPutParentWritesAllOrNothing: a put whose parent_writes are
// refused writes none of them, though an earlier task's were good, and the
// problem names parent_writes.
func TestCheckpointPutParentWritesAllOrNothing(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.put("pa", map[string]any{"checkpoint_id": "c1", "state": b64("s0")}).want(t, 201)
	good := map[string]any{"task_id": "t1", "writes": []map[string]any{{"channel": "a", "value": b64("1")}}}
	half := map[string]any{"task_id": "t1", "writes": []map[string]any{{"channel": "a", "value": b64(strings.Repeat("x", 420<<10))}}}
	for name, c := range map[string]struct {
		tw  []map[string]any
		loc string
	}{
		"a bad task id after a good one": {[]map[string]any{good, {"task_id": "t/2", "writes": []map[string]any{{"channel": "b"}}}}, "body.parent_writes[1].task_id"},
		"past the bound together":        {[]map[string]any{half, {"task_id": "t2", "writes": half["writes"]}}, "body.parent_writes"},
	} {
		before := a.keyCount()
		p := a.put("pa", map[string]any{"checkpoint_id": "c2", "parent_checkpoint_id": "c1", "state": b64("s1"), "parent_writes": c.tw}).problem(t, 400)
		if loc := p.JSON["errors"].([]any)[0].(map[string]any)["location"]; loc != c.loc {
			t.Errorf("%s: location %v, want %s: %s", name, loc, c.loc, p.Raw)
		}
		if n := a.keyCount(); n != before {
			t.Errorf("%s: the refused put changed the keys: %d, then %d", name, before, n)
		}
	}
}
