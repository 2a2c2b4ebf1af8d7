package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
)

// chainBody is a chain of checkpoints ids after parent, fenced by lock
// under session with tok, each carrying one write of its parent.
func chainBody(parent, lock, session string, tok float64, ids ...string) map[string]any {
	var cps []map[string]any
	for _, id := range ids {
		cp := map[string]any{"checkpoint_id": id, "state": b64(id), "metadata": map[string]any{"step": len(cps)}}
		if parent != "" {
			cp["parent_checkpoint_id"] = parent
			cp["parent_writes"] = []map[string]any{{"task_id": "t-" + parent, "writes": []map[string]any{{"channel": "c", "value": b64(parent)}}}}
		}
		cps, parent = append(cps, cp), id
	}
	return map[string]any{"mode": "append", "checkpoints": cps, "lock": lock, "session": session, "token": tok,
		"writes": []map[string]any{{"task_id": "t-last", "writes": []map[string]any{{"channel": "c"}}}}}
}

// TestCheckpointChainRoute: a chain is stored with its writes, the last
// its head, each with its parent; repeated it stores the same; under a
// lost lock or on a bad chain it is refused, naming the field, and
// stores nothing.
func TestCheckpointChainRoute(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s, s2 := a.session(30), a.session(30)
	l := a.do("POST", "/v1/locks/thread-c", map[string]any{"session": s}).want(t, 200)
	tok := l.num("token")
	a.put("tc", map[string]any{"checkpoint_id": "c0", "state": b64("c0"), "lock": "thread-c", "session": s, "token": tok}).want(t, 201)
	for range 2 {
		r := a.do("POST", "/v1/threads/tc/checkpoint-chains", chainBody("c0", "thread-c", s, tok, "c1", "c2", "c3")).want(t, 201)
		if cps, _ := r.JSON["checkpoints"].([]any); len(cps) != 3 || cps[2].(map[string]any)["checkpoint_id"] != "c3" ||
			cps[2].(map[string]any)["parent_checkpoint_id"] != "c2" || cps[0].(map[string]any)["token"].(float64) != tok {
			t.Fatalf("the chain's answer: %s", r.Raw)
		}
	}
	h := a.do("GET", "/v1/threads/tc/head", nil).want(t, 200)
	if h.str("checkpoint_id") != "c3" || h.str("parent_checkpoint_id") != "c2" || unb64(t, h, "state") != "c3" {
		t.Fatalf("the head after the chain: %s", h.Raw)
	}
	for _, id := range []string{"c0", "c1", "c2", "c3"} {
		if n := a.parentWriteCount("tc", id); n != 1 {
			t.Fatalf("%s has %d pending writes after the chain twice, want 1", id, n)
		}
	}
	a.wantCheckpointList("/v1/threads/tc/checkpoints", "c3", "c2", "c1", "c0")

	before := a.keyCount()
	bad := chainBody("c3", "thread-c", s, tok, "d1", "d2")
	bad["checkpoints"].([]map[string]any)[1]["parent_checkpoint_id"] = "c3"
	if p := a.do("POST", "/v1/threads/tc/checkpoint-chains", bad).problem(t, 400); !strings.Contains(string(p.Raw), "body.checkpoints[1].parent_checkpoint_id") {
		t.Fatalf("a chain that does not follow on: %s", p.Raw)
	}
	bad = chainBody("c3", "thread-c", s, tok, "d1")
	bad["checkpoints"].([]map[string]any)[0]["checkpoint_id"] = "bad id"
	if p := a.do("POST", "/v1/threads/tc/checkpoint-chains", bad).problem(t, 400); !strings.Contains(string(p.Raw), "body.checkpoints[0].checkpoint_id") {
		t.Fatalf("a bad id: %s", p.Raw)
	}
	a.do("POST", "/v1/threads/tc/checkpoint-chains", chainBody("gone", "thread-c", s, tok, "d1")).problem(t, 404)
	cas := chainBody("c1", "thread-c", s, tok, "d1")
	cas["mode"] = "cas"
	if p := a.do("POST", "/v1/threads/tc/checkpoint-chains", cas).problem(t, 409); !strings.Contains(p.str("detail"), "c3") {
		t.Fatalf("a chain on an old parent in mode cas: %s", p.Raw)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/thread-c?token=%d&session=", int64(tok))+s+"&contender="+l.str("contender"), nil).want(t, 204)
	a.do("POST", "/v1/locks/thread-c", map[string]any{"session": s2}).want(t, 200)
	a.do("POST", "/v1/threads/tc/checkpoint-chains", chainBody("c3", "thread-c", s, tok, "d1", "d2")).problem(t, 409)
	if n := a.keyCount(); n != before || a.parentWriteCount("tc", "c3") != 1 {
		t.Fatalf("refused chains stored something: %d keys, then %d", before, n)
	}
}

// TestCheckpointChainStoredInPart: a chain too large for one transaction
// refused at its second checkpoint says how many were stored and which is
// the head, and the head is that one.
func TestCheckpointChainStoredInPart(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	big := b64(strings.Repeat("s", 700<<10))
	body := map[string]any{"mode": "append", "checkpoints": []map[string]any{
		{"checkpoint_id": "p0", "state": big},
		{"checkpoint_id": "p1", "parent_checkpoint_id": "p0", "state": big,
			"parent_writes": []map[string]any{{"task_id": "t", "writes": []map[string]any{{"channel": "c", "value": b64(strings.Repeat("v", 1<<20))}}}}},
		{"checkpoint_id": "p2", "parent_checkpoint_id": "p1", "state": big},
	}}
	p := a.do("POST", "/v1/threads/tp/checkpoint-chains", body).problem(t, 400)
	if !strings.Contains(p.str("detail"), "the first 1 of 3 checkpoints were stored, and the thread's head is p0") {
		t.Fatalf("a chain stored in part: %s", p.Raw)
	}
	if h := a.do("GET", "/v1/threads/tp/head", nil).want(t, 200); h.str("checkpoint_id") != "p0" {
		t.Fatalf("the head: %s", h.Raw)
	}
}
