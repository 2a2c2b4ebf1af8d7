package httpapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
)

// put puts a checkpoint on thread with body fields, and returns the answer.
func (a *api) put(thread string, body map[string]any) resp {
	a.t.Helper()
	return a.do("POST", "/v1/threads/"+thread+"/checkpoints", body)
}

// ids returns the checkpoint ids of a list answer, in order.
func ids(r resp) []string {
	var out []string
	for _, c := range r.List {
		out = append(out, c.(map[string]any)["checkpoint_id"].(string))
	}
	return out
}

// wantCheckpointList fails the test unless GET path lists checkpoints want, in order.
func (a *api) wantCheckpointList(path string, want ...string) {
	a.t.Helper()
	if l := a.do("GET", path, nil).want(a.t, 200); strings.Join(ids(l), ",") != strings.Join(want, ",") {
		a.t.Fatalf("GET %s: %s, want %v", path, l.Raw, want)
	}
}

// TestCheckpointSaverRoutes: LangGraph's saver on the routes alone: put a
// chain, getTuple (head and by id, with pending writes), the raw state,
// list with before, limit and filters, a second checkpoint namespace, and
// deleteThread, after which no key of the thread is left.
func TestCheckpointSaverRoutes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	empty := a.keyCount()
	r := a.put("th-1", map[string]any{"state": b64("s0"), "metadata": map[string]any{"source": "input", "step": -1, "writer": "w"}}).want(t, 201)
	first := r.str("checkpoint_id")
	if first == "" || r.str("parent_checkpoint_id") != "" {
		t.Fatalf("first put: %s", r.Raw)
	}
	second := a.put("th-1", map[string]any{"parent_checkpoint_id": first, "checkpoint_id": first + "1", "state": b64("s1"),
		"metadata": map[string]any{"source": "loop", "step": 0, "user": "ann"}}).want(t, 201).str("checkpoint_id")
	if second != first+"1" {
		t.Fatalf("the given id was not kept: %s", second)
	}
	third := a.put("th-1", map[string]any{"parent_checkpoint_id": second, "state": b64("s2"), "metadata": map[string]any{"source": "loop", "step": 1}}).want(t, 201).str("checkpoint_id")

	a.do("POST", "/v1/threads/th-1/checkpoints/"+third+"/writes", map[string]any{"task_id": "task-1",
		"writes": []map[string]any{{"channel": "messages", "value": b64("hi")}, {"channel": "__error__", "value": b64("e")}}}).want(t, 204)
	a.do("POST", "/v1/threads/th-1/checkpoints/"+third+"/writes", map[string]any{"task_id": "task-0", "writes": []map[string]any{{"channel": "c", "value": b64("v")}}}).want(t, 204)
	h := a.do("GET", "/v1/threads/th-1/head", nil).want(t, 200)
	ws, _ := h.JSON["pending_writes"].([]any)
	if h.str("checkpoint_id") != third || h.str("parent_checkpoint_id") != second || unb64(t, h, "state") != "s2" || len(ws) != 3 ||
		ws[0].(map[string]any)["task_id"] != "task-0" || ws[1].(map[string]any)["channel"] != "messages" || ws[2].(map[string]any)["idx"].(float64) != 1 {
		t.Fatalf("head with its pending writes: %s", h.Raw)
	}
	g := a.do("GET", "/v1/threads/th-1/checkpoints/"+first, nil).want(t, 200)
	if m := g.JSON["metadata"].(map[string]any); unb64(t, g, "state") != "s0" || m["source"] != "input" || m["step"].(float64) != -1 || m["writer"] != "w" {
		t.Fatalf("get by id: %s", g.Raw)
	}
	if ws := g.JSON["pending_writes"].([]any); len(ws) != 0 {
		t.Fatalf("writes of another checkpoint: %s", g.Raw)
	}
	raw := a.do("GET", "/v1/threads/th-1/checkpoints/"+second+"/state", nil).want(t, 200)
	if string(raw.Raw) != "s1" || raw.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("raw state: %q %s", raw.Raw, raw.Header.Get("Content-Type"))
	}

	for q, want := range map[string]string{
		"":                                  third + "," + second + "," + first,
		"?limit=1":                          third,
		"?before=" + third:                  second + "," + first,
		"?filter=source=loop":               third + "," + second,
		"?filter=source=loop&filter=step=0": second,
		"?filter=user=ann":                  second,
		"?filter=step=-1":                   first,
		"?filter=source=update":             "",
	} {
		l := a.do("GET", "/v1/threads/th-1/checkpoints"+q, nil).want(t, 200)
		if got := strings.Join(ids(l), ","); got != want || l.List == nil {
			t.Errorf("list%s: %s, want %s (%s)", q, got, want, l.Raw)
		}
	}
	if l := a.do("GET", "/v1/threads/th-1/checkpoints?limit=1", nil); len(l.List[0].(map[string]any)["pending_writes"].([]any)) != 3 {
		t.Fatalf("list without pending writes: %s", l.Raw)
	}

	sub := a.put("th-1", map[string]any{"checkpoint_ns": "child:1", "state": b64("sub")}).want(t, 201).str("checkpoint_id")
	a.wantCheckpointList("/v1/threads/th-1/checkpoints", sub, third, second, first)           // every namespace
	a.wantCheckpointList("/v1/threads/th-1/checkpoints?checkpoint_ns=", third, second, first) // the default one
	if h := a.do("GET", "/v1/threads/th-1/head?checkpoint_ns=child:1", nil).want(t, 200); h.str("checkpoint_id") != sub || h.str("checkpoint_ns") != "child:1" {
		t.Fatalf("head of the child namespace: %s", h.Raw)
	}
	if h := a.do("GET", "/v1/threads/th-1/head", nil); h.str("checkpoint_id") != third {
		t.Fatalf("a child namespace moved the default head: %s", h.Raw)
	}
	a.do("GET", "/v1/threads/th-1/checkpoints/"+sub, nil).problem(t, 404) // not in the default namespace
	a.do("GET", "/v1/threads/th-1/checkpoints/"+sub+"?checkpoint_ns=child:1", nil).want(t, 200)

	a.do("DELETE", "/v1/threads/th-1", nil).want(t, 204)
	a.do("GET", "/v1/threads/th-1/head", nil).problem(t, 404)
	a.do("GET", "/v1/threads/th-1/head?checkpoint_ns=child:1", nil).problem(t, 404)
	a.do("GET", "/v1/threads/th-1/checkpoints/"+first, nil).problem(t, 404)
	a.do("GET", "/v1/threads/th-1/checkpoints/"+first+"/state", nil).problem(t, 404)
	if l := a.do("GET", "/v1/threads/th-1/checkpoints", nil).want(t, 200); len(l.List) != 0 {
		t.Fatalf("list after delete: %s", l.Raw)
	}
	if n := a.keyCount(); n != empty {
		t.Fatalf("%d keys after deleteThread, %d before the thread", n, empty)
	}
	a.do("DELETE", "/v1/threads/th-1", nil).want(t, 204) // deleting nothing is fine
}

// TestCheckpointCompareAndSwapConflict: a put whose parent is not the head
// is a 409 naming the head, and changes nothing; so is a put writes for a
// checkpoint that does not exist (404).
func TestCheckpointCompareAndSwapConflict(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	root := a.put("th", map[string]any{"state": b64("0")}).want(t, 201).str("checkpoint_id")
	winner := a.put("th", map[string]any{"parent_checkpoint_id": root, "state": b64("a")}).want(t, 201).str("checkpoint_id")
	before := a.keyCount()
	p := a.put("th", map[string]any{"parent_checkpoint_id": root, "state": b64("b")}).problem(t, 409)
	if !strings.Contains(p.str("detail"), winner) {
		t.Fatalf("the conflict does not name the head %s: %s", winner, p.Raw)
	}
	a.put("th", map[string]any{"state": b64("c")}).problem(t, 409) // "first" on a thread with a head
	a.put("th", map[string]any{"parent_checkpoint_id": "no-such", "state": b64("d")}).problem(t, 409)
	a.do("POST", "/v1/threads/th/checkpoints/no-such/writes", map[string]any{"task_id": "t", "writes": []map[string]any{{"channel": "c", "value": b64("v")}}}).problem(t, 404)
	if n := a.keyCount(); n != before {
		t.Fatalf("refused puts changed the keys: %d, then %d", before, n)
	}
	h := a.do("GET", "/v1/threads/th/head", nil).want(t, 200)
	if h.str("checkpoint_id") != winner || unb64(t, h, "state") != "a" {
		t.Fatalf("the head after conflicts: %s", h.Raw)
	}
}

// TestCheckpointLockFencedPut: a put and put writes fenced by a drover lock
// held under a session succeed with its token; after the lock changed hands
// (released and taken again, or the session ended), the stale token is a
// 409 that writes nothing, and so is a lower token of another lock once a
// higher one was seen for the thread.
func TestCheckpointLockFencedPut(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s, s2 := a.session(30), a.session(30)
	older := a.do("POST", "/v1/locks/other", map[string]any{"session": s}).want(t, 200).num("token")
	l1 := a.do("POST", "/v1/locks/thread-x", map[string]any{"session": s}).want(t, 200)
	tok1 := l1.num("token")
	fenced := func(parent string, tok float64, state string) map[string]any {
		return map[string]any{"parent_checkpoint_id": parent, "state": b64(state), "lock": "thread-x", "session": s, "token": tok}
	}
	r := a.put("tx", fenced("", tok1, "one")).want(t, 201)
	head := r.str("checkpoint_id")
	if r.num("token") != tok1 {
		t.Fatalf("put under token %v: %s", tok1, r.Raw)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/thread-x?token=%d&session=%s&contender=%s", int64(tok1), s, l1.str("contender")), nil).want(t, 204)
	tok2 := a.do("POST", "/v1/locks/thread-x", map[string]any{"session": s}).want(t, 200).num("token")

	before := a.keyCount()
	p := a.put("tx", fenced(head, tok1, "stale")).problem(t, 409)
	if !strings.Contains(p.str("type"), "fenced") {
		t.Fatalf("a stale token: %s", p.Raw)
	}
	if _, secret, _ := strings.Cut(s, "."); strings.Contains(string(p.Raw), secret) {
		t.Fatalf("the 409 repeats the session's secret: %s", p.Raw)
	}
	writes := func(lock string, tok float64) map[string]any {
		return map[string]any{"task_id": "t1", "writes": []map[string]any{{"channel": "c", "value": b64("v")}}, "lock": lock, "session": s, "token": tok}
	}
	a.do("POST", "/v1/threads/tx/checkpoints/"+head+"/writes", writes("thread-x", tok1)).problem(t, 409)
	other := s
	s = s2 // the right token under another session
	a.put("tx", fenced(head, tok2, "wrong-session")).problem(t, 409)
	s = other
	if n := a.keyCount(); n != before {
		t.Fatalf("stale writes changed the keys: %d, then %d", before, n)
	}

	head = a.put("tx", fenced(head, tok2, "two")).want(t, 201).str("checkpoint_id")
	a.do("POST", "/v1/threads/tx/checkpoints/"+head+"/writes", writes("thread-x", tok2)).want(t, 204)
	// Lock "other" is held, but its token is below the one the thread saw.
	before = a.keyCount()
	stale := map[string]any{"parent_checkpoint_id": head, "state": b64("older"), "lock": "other", "session": s, "token": older}
	a.put("tx", stale).problem(t, 409)
	a.do("POST", "/v1/threads/tx/checkpoints/"+head+"/writes", writes("other", older)).problem(t, 409)
	if n := a.keyCount(); n != before {
		t.Fatalf("a lower token changed the keys: %d, then %d", before, n)
	}
	if h := a.do("GET", "/v1/threads/tx/head", nil).want(t, 200); h.str("checkpoint_id") != head || unb64(t, h, "state") != "two" || h.num("token") != tok2 {
		t.Fatalf("head: %s", h.Raw)
	}

	a.do("DELETE", "/v1/sessions/"+s, nil).want(t, 204) // the lock ends with it
	a.put("tx", fenced(head, tok2, "after")).problem(t, 409)
}

// TestCheckpointStoreFull: past the high-water mark puts and put writes are
// 507 and write nothing; reads and deleteThread still work.
func TestCheckpointStoreFull(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	head := a.put("full", map[string]any{"state": b64("x")}).want(t, 201).str("checkpoint_id")
	keys := keyspace.MustNew(a.ns)
	if err := storeguard.Set(context.Background(), a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	before := a.keyCount()
	a.put("full", map[string]any{"parent_checkpoint_id": head, "state": b64("y")}).problem(t, 507)
	a.do("POST", "/v1/threads/full/checkpoints/"+head+"/writes", map[string]any{"task_id": "t", "writes": []map[string]any{{"channel": "c", "value": b64("v")}}}).problem(t, 507)
	if n := a.keyCount(); n != before {
		t.Fatalf("writes past the high-water mark changed the keys: %d, then %d", before, n)
	}
	a.do("GET", "/v1/threads/full/head", nil).want(t, 200)
	a.do("DELETE", "/v1/threads/full", nil).want(t, 204)
	if err := storeguard.Clear(context.Background(), a.cli, keys); err != nil {
		t.Fatal(err)
	}
}

// TestCheckpointLargeState: a put of state near the store's 1 MiB bound (a
// body above the server's default limit) is accepted and read back whole,
// and so are a put and an append of it fenced by a held lock.
func TestCheckpointLargeState(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	state := bytes.Repeat([]byte("z"), checkpoint.MaxState)
	enc := base64.StdEncoding.EncodeToString(state)
	a.put("big", map[string]any{"state": enc}).want(t, 201)
	if raw := a.do("GET", "/v1/threads/big/head", nil).want(t, 200); unb64(t, raw, "state") != string(state) {
		t.Fatal("the large state did not come back whole")
	}
	s := a.session(30)
	tok := a.do("POST", "/v1/locks/thread-fbig", map[string]any{"session": s}).want(t, 200).num("token")
	fenced := map[string]any{"checkpoint_id": "c1", "state": enc, "lock": "thread-fbig", "session": s, "token": tok}
	a.put("fbig", fenced).want(t, 201)
	fenced["checkpoint_id"], fenced["parent_checkpoint_id"], fenced["mode"] = "c2", "c1", "append"
	a.put("fbig", fenced).want(t, 201)
	if raw := a.do("GET", "/v1/threads/fbig/head", nil).want(t, 200); raw.str("checkpoint_id") != "c2" || unb64(t, raw, "state") != string(state) {
		t.Fatal("the fenced large state did not come back whole")
	}
}

// TestCheckpointBadInput: malformed JSON, wrong types, unknown fields,
// invalid names, bad base64, out-of-range numbers, a partial fence and
// oversized bodies are 400 or 413 problems on every route, and write
// nothing.
func TestCheckpointBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	head := a.put("ok", map[string]any{"state": b64("x")}).want(t, 201).str("checkpoint_id")
	cases := badCheckpointRequests(a.session(30), head)
	before := a.keyCount()
	for _, c := range cases {
		r := a.do(c.method, c.path, c.body)
		if r.Status != c.code {
			t.Errorf("%s %s %.80v: %d, want %d: %.300s", c.method, c.path, c.body, r.Status, c.code, r.Raw)
			continue
		}
		r.problem(t, c.code)
	}
	if n := a.keyCount(); n != before {
		t.Fatalf("bad input changed the keys: %d, then %d", before, n)
	}
	if h := a.do("GET", "/v1/threads/ok/head", nil).want(t, 200); h.str("checkpoint_id") != head || len(h.JSON["pending_writes"].([]any)) != 0 {
		t.Fatalf("bad input wrote something: %s", h.Raw)
	}
}

// badCheckpointRequest is a request that must be refused with code.
type badCheckpointRequest struct {
	method, path string
	body         any
	code         int
}

// badCheckpointRequests are bad requests on the checkpoint routes, for
// thread "ok" whose head is head, with session s.
func badCheckpointRequests(s, head string) []badCheckpointRequest {
	overState := base64.StdEncoding.EncodeToString(make([]byte, checkpoint.MaxState+1))
	huge := strings.Repeat("A", 2<<20)
	w := func(extra string) string {
		return `{"task_id":"t","writes":[{"channel":"c","value":"dg=="}]` + extra + `}`
	}
	wp := "/v1/threads/ok/checkpoints/" + head + "/writes"
	return []badCheckpointRequest{
		{"POST", "/v1/threads/ok/checkpoints", `{"state":`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state": 5}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","color":1}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"not base64!"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","metadata":5}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","metadata":[{"step":1}]}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","metadata":{"step":1`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","mode":"merge"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","mode":""}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","mode":"append","checkpoint_id":"c","parent_checkpoint_id":"c"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","mode":"append","checkpoint_ns":"a\u0000b"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","mode":"append","checkpoint_ns":"a\nb"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":"eA==","mode":"append","checkpoint_ns":%q}`, strings.Repeat("n", 1025)), 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":"eA==","mode":"append","checkpoint_ns":%q}`, strings.Repeat("é", 600)), 400},
		{"POST", "/v1/threads/bad*t/checkpoints", `{"state":"eA=="}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","checkpoint_id":"../x"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","parent_checkpoint_id":"a b"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","lock":"l"}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":"eA==","lock":"l","session":%q}`, s), 400},
		{"POST", "/v1/threads/ok/checkpoints", `{"state":"eA==","lock":"l","session":"xyz","token":3}`, 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":"eA==","lock":"bad name","session":%q,"token":3}`, s), 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":"eA==","lock":"l","session":%q,"token":-3}`, s), 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":%q}`, overState), 400},
		{"POST", "/v1/threads/ok/checkpoints", fmt.Sprintf(`{"state":%q}`, huge), 413},
		{"POST", wp, w("")[:15], 400},
		{"POST", wp, w(`,"x":1`), 400},
		{"POST", wp, `{"writes":[{"channel":"c","value":"dg=="}]}`, 400},
		{"POST", wp, `{"task_id":"t","writes":[{"channel":7,"value":"dg=="}]}`, 400},
		{"POST", wp, `{"task_id":"t","writes":[{"channel":"c","value":"%%%"}]}`, 400},
		{"POST", wp, `{"task_id":"t*t","writes":[]}`, 400},
		{"POST", wp, w(`,"checkpoint_ns":"a\u0001b"`), 400},
		{"POST", wp, `{"task_id":"t","writes":[{"channel":"c","value":"dg==","idx":"one"}]}`, 400},
		{"POST", wp, `{"task_id":"t","writes":[{"channel":"c","value":"dg==","idx":1.5}]}`, 400},
		{"POST", wp, `{"task_id":"t","writes":[{"channel":"c","value":"dg==","idx":4294967296}]}`, 400},
		{"POST", wp, w(`,"token":5`), 400},
		{"POST", "/v1/threads/ok/checkpoints/bad*id/writes", w(""), 400},
		{"POST", wp, `{"task_id":"t","writes":[{"channel":"c","value":"` + huge + `"}]}`, 413},
		{"GET", "/v1/threads/bad*t/head", nil, 400},
		{"GET", "/v1/threads/ok/head?checkpoint_ns=a%01b", nil, 400},
		{"GET", "/v1/threads/ok/head?checkpoint_ns=%ff", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints/bad*id", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints/" + head + "?checkpoint_ns=%7f", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?checkpoint_ns=%00", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?filter==1", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints/bad*id/state", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?limit=5000", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?limit=-1", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?limit=ten", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?before=a*b", nil, 400},
		{"GET", "/v1/threads/ok/checkpoints?filter=source", nil, 400},
		{"GET", "/v1/threads/bad*t/checkpoints", nil, 400},
		{"GET", "/v1/checkpoints?checkpoint_ns=%00", nil, 400},
		{"GET", "/v1/checkpoints?before=a*b", nil, 400},
		{"GET", "/v1/checkpoints?limit=5000", nil, 400},
		{"GET", "/v1/checkpoints?limit=-1", nil, 400},
		{"GET", "/v1/checkpoints?filter==1", nil, 400},
		{"GET", "/v1/checkpoints?filter=source", nil, 400},
		{"DELETE", "/v1/threads/bad*t", nil, 400},
		{"DELETE", "/v1/threads/" + strings.Repeat("t", 129), nil, 400},
	}
}

// TestCheckpointForkAppend: mode append (LangGraph's put) writes on an
// older parent (update_state, a replay) or none, and moves the head; mode
// cas keeps refusing a stale parent; a lock-fenced append is refused once
// the lock changed hands, and writes nothing.
func TestCheckpointForkAppend(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	c1 := a.put("fk", map[string]any{"state": b64("1")}).want(t, 201).str("checkpoint_id")
	c2 := a.put("fk", map[string]any{"parent_checkpoint_id": c1, "mode": "cas", "state": b64("2")}).want(t, 201).str("checkpoint_id")
	before := a.keyCount()
	a.put("fk", map[string]any{"parent_checkpoint_id": c1, "state": b64("x")}).problem(t, 409)
	if n := a.keyCount(); n != before {
		t.Fatalf("a refused cas put wrote: %d, then %d", before, n)
	}
	fork := a.put("fk", map[string]any{"parent_checkpoint_id": c1, "mode": "append", "checkpoint_id": c2 + "f", "state": b64("fork"),
		"metadata": map[string]any{"source": "fork", "step": 1, "parents": map[string]any{}}}).want(t, 201)
	if fork.str("checkpoint_id") != c2+"f" || fork.str("parent_checkpoint_id") != c1 {
		t.Fatalf("fork: %s", fork.Raw)
	}
	h := a.do("GET", "/v1/threads/fk/head", nil).want(t, 200)
	if h.str("checkpoint_id") != c2+"f" || h.str("parent_checkpoint_id") != c1 || unb64(t, h, "state") != "fork" {
		t.Fatalf("head after the fork: %s", h.Raw)
	}
	a.put("fk", map[string]any{"parent_checkpoint_id": c2, "state": b64("y")}).problem(t, 409) // cas on the old head
	orphan := a.put("fk", map[string]any{"mode": "append", "state": b64("o")}).want(t, 201).str("checkpoint_id")
	if l := a.do("GET", "/v1/threads/fk/checkpoints", nil).want(t, 200); strings.Join(ids(l), ",") != orphan+","+c2+"f,"+c2+","+c1 {
		t.Fatalf("list after forks: %s", l.Raw)
	}

	s := a.session(30)
	l1 := a.do("POST", "/v1/locks/fk", map[string]any{"session": s}).want(t, 200)
	tok1 := l1.num("token")
	appendUnder := func(tok float64, state string) resp {
		return a.put("fk", map[string]any{"mode": "append", "parent_checkpoint_id": c1, "state": b64(state), "lock": "fk", "session": s, "token": tok})
	}
	if r := appendUnder(tok1, "locked").want(t, 201); r.num("token") != tok1 {
		t.Fatalf("fenced append: %s", r.Raw)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/fk?token=%d&session=%s&contender=%s", int64(tok1), s, l1.str("contender")), nil).want(t, 204)
	tok2 := a.do("POST", "/v1/locks/fk", map[string]any{"session": s}).want(t, 200).num("token")
	before = a.keyCount()
	appendUnder(tok1, "stale").problem(t, 409)
	if n := a.keyCount(); n != before {
		t.Fatalf("a fenced-out append wrote: %d, then %d", before, n)
	}
	if h := a.do("GET", "/v1/threads/fk/head", nil).want(t, 200); unb64(t, h, "state") != "locked" {
		t.Fatalf("head after a fenced-out append: %s", h.Raw)
	}
	appendUnder(tok2, "new holder").want(t, 201)
}

// TestCheckpointMetadataJSON: metadata is any JSON object, returned
// unaltered by getTuple and list; list filters by deep equality of
// top-level keys, JSON values (a value that is not JSON is a string).
func TestCheckpointMetadataJSON(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	meta := `{"source":"loop","step":0,"parents":{"":"1ef","sub|x:1":"2ab"},"writes":{"node":[{"k":[1,2]},null]},"user_id":"u-7","n":1.5,"ok":false}`
	id := a.put("md", map[string]any{"state": b64("s"), "metadata": json.RawMessage(meta)}).want(t, 201).str("checkpoint_id")
	other := a.put("md", map[string]any{"parent_checkpoint_id": id, "state": b64("s"), "metadata": map[string]any{"source": "input", "step": -1, "count": "3"}}).
		want(t, 201).str("checkpoint_id")
	same := func(got any) bool {
		want := map[string]any{}
		_ = json.Unmarshal([]byte(meta), &want)
		return reflect.DeepEqual(got, want)
	}
	if g := a.do("GET", "/v1/threads/md/checkpoints/"+id, nil).want(t, 200); !same(g.JSON["metadata"]) {
		t.Fatalf("metadata altered: %s", g.Raw)
	}
	if l := a.do("GET", "/v1/threads/md/checkpoints?limit=1&before="+other, nil).want(t, 200); len(l.List) != 1 || !same(l.List[0].(map[string]any)["metadata"]) {
		t.Fatalf("metadata altered in list: %s", l.Raw)
	}
	for q, want := range map[string]string{
		"source=loop":   id,
		`source="loop"`: id,
		"step=0":        id,
		"step=-1.0":     other,
		`step="0"`:      "",
		"parents=" + url.QueryEscape(`{"sub|x:1":"2ab","":"1ef"}`):   id,
		"parents=" + url.QueryEscape(`{"":"1ef"}`):                   "",
		"writes=" + url.QueryEscape(`{"node":[{"k":[1,2.0]},null]}`): id,
		"n=1.50&ok=false":          id,
		"user_id=u-7&source=input": "",
		"count=3":                  "",
		"count=%223%22":            other,
		"missing=null":             "",
		"source=loop&step=0":       id,
	} {
		l := a.do("GET", "/v1/threads/md/checkpoints?filter="+strings.ReplaceAll(q, "&", "&filter="), nil).want(t, 200)
		if got := strings.Join(ids(l), ","); got != want {
			t.Errorf("filter=%s: %q, want %q", q, got, want)
		}
	}
}

// TestCheckpointWriteIdx: each write is saved at its idx (default: its
// position in the call): a regular write (idx >= 0) is insert-if-absent, a
// special one (negative idx) an upsert; writes come back by task then idx.
func TestCheckpointWriteIdx(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := a.put("wi", map[string]any{"state": b64("s")}).want(t, 201).str("checkpoint_id")
	path := "/v1/threads/wi/checkpoints/" + id + "/writes"
	wr := func(ch, v string, idx ...int) map[string]any {
		m := map[string]any{"channel": ch, "value": b64(v)}
		if len(idx) > 0 {
			m["idx"] = idx[0]
		}
		return m
	}
	for _, ws := range [][]map[string]any{
		{wr("messages", "a"), wr("other", "b")},                      // idx 0 and 1 by position
		{wr("messages", "retry"), wr("__error__", "e1", -1)},         // idx 0 exists: kept
		{wr("__error__", "e2", -1), wr("__interrupt__", "i", -3)},    // -1 replaced
		{wr("late", "c", 5), wr("late", "dup", 5), wr("x", "z", -4)}, // first of duplicates wins
	} {
		a.do("POST", path, map[string]any{"task_id": "t1", "writes": ws}).want(t, 204)
	}
	a.do("POST", path, map[string]any{"task_id": "t0", "writes": []map[string]any{wr("m", "t0")}}).want(t, 204)
	a.do("POST", path, map[string]any{"task_id": "t9", "writes": []map[string]any{{"channel": "empty"}}}).want(t, 204) // an empty value
	g := a.do("GET", "/v1/threads/wi/checkpoints/"+id, nil).want(t, 200)
	var got []string
	for _, w := range g.JSON["pending_writes"].([]any) {
		m := w.(map[string]any)
		v, _ := base64.StdEncoding.DecodeString(m["value"].(string))
		got = append(got, fmt.Sprintf("%s/%v/%s=%s", m["task_id"], m["idx"], m["channel"], v))
	}
	want := "t0/0/m=t0 t1/-4/x=z t1/-3/__interrupt__=i t1/-1/__error__=e2 t1/0/messages=a t1/1/other=b t1/5/late=c t9/0/empty="
	if strings.Join(got, " ") != want {
		t.Fatalf("writes:\n%s\nwant\n%s", strings.Join(got, " "), want)
	}
}

// TestCheckpointNamespacesList: LangGraph's subgraph namespaces ('|', ':',
// longer than 128 bytes, any text) are accepted and kept apart, on every
// route; a list without checkpoint_ns returns every namespace's
// checkpoints newest first, with before, limit and filter; deleteThread
// removes them all.
func TestCheckpointNamespacesList(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	empty := a.keyCount()
	long := strings.Repeat("agent:1f0b3f7e-0d3c-6a2e-8000-0123456789ab|", 10) + "tools:9"
	nss := []string{"", "child:1", "parent:1|child:2", long, "nœud 2|x"}
	var all []string // ids, oldest first
	for round, src := range []string{"input", "loop"} {
		for i, ns := range nss {
			id := fmt.Sprintf("id-%d-%d", round, i)
			a.put("ns", map[string]any{"checkpoint_ns": ns, "checkpoint_id": id, "mode": "append", "state": b64("s:" + ns), "metadata": map[string]any{"source": src}}).want(t, 201)
			a.do("POST", "/v1/threads/ns/checkpoints/"+id+"/writes", map[string]any{"checkpoint_ns": ns, "task_id": "t", "writes": []map[string]any{{"channel": "c", "value": b64("v:" + ns)}}}).want(t, 204)
			all = append(all, id)
		}
	}
	for i, ns := range nss {
		q := "?checkpoint_ns=" + url.QueryEscape(ns)
		h := a.do("GET", "/v1/threads/ns/head"+q, nil).want(t, 200)
		ws, _ := h.JSON["pending_writes"].([]any)
		if h.str("checkpoint_id") != fmt.Sprintf("id-1-%d", i) || h.str("checkpoint_ns") != ns || unb64(t, h, "state") != "s:"+ns || len(ws) != 1 {
			t.Fatalf("head of %q: %s", ns, h.Raw)
		}
		a.do("GET", "/v1/threads/ns/checkpoints/id-0-"+fmt.Sprint(i)+q, nil).want(t, 200)
		if raw := a.do("GET", "/v1/threads/ns/checkpoints/id-0-"+fmt.Sprint(i)+"/state"+q, nil).want(t, 200); string(raw.Raw) != "s:"+ns {
			t.Fatalf("state of %q: %q", ns, raw.Raw)
		}
		if l := a.do("GET", "/v1/threads/ns/checkpoints"+q, nil).want(t, 200); strings.Join(ids(l), ",") != fmt.Sprintf("id-1-%d,id-0-%d", i, i) {
			t.Fatalf("list of %q: %s", ns, l.Raw)
		}
	}
	a.do("GET", "/v1/threads/ns/checkpoints/id-0-2?checkpoint_ns=parent:1", nil).problem(t, 404) // a prefix is another namespace
	newest := func(ids []string) string {
		out := make([]string, len(ids))
		for i, id := range ids {
			out[len(ids)-1-i] = id
		}
		return strings.Join(out, ",")
	}
	n := len(nss)
	for q, want := range map[string]string{
		"":                       newest(all),
		"?limit=3":               newest(all[2*n-3:]),
		"?before=id-1-1&limit=3": newest(all[n-2 : n+1]),
		"?filter=source=input":   newest(all[:n]),
		"?filter=source=loop&limit=2&before=id-1-4": newest(all[2*n-3 : 2*n-1]),
	} {
		l := a.do("GET", "/v1/threads/ns/checkpoints"+q, nil).want(t, 200)
		if got := strings.Join(ids(l), ","); got != want {
			t.Errorf("list%s: %s, want %s", q, got, want)
		}
	}
	l := a.do("GET", "/v1/threads/ns/checkpoints", nil).want(t, 200)
	for _, c := range l.List {
		if ws := c.(map[string]any)["pending_writes"].([]any); len(ws) != 1 {
			t.Fatalf("list of every namespace without pending writes: %s", l.Raw)
		}
	}
	a.do("DELETE", "/v1/threads/ns", nil).want(t, 204)
	if n := a.keyCount(); n != empty {
		t.Fatalf("%d keys after deleteThread, %d before", n, empty)
	}
}
