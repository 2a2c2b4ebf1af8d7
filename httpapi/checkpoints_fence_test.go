package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
)

// fencedPut is the body of a put of id on parent fenced by lock under
// session with tok, carrying one write of task for the parent.
func fencedPut(id, parent, lock, session string, tok float64, task string) map[string]any {
	return map[string]any{"checkpoint_id": id, "parent_checkpoint_id": parent, "state": b64(id), "lock": lock, "session": session, "token": tok,
		"parent_writes": []map[string]any{{"task_id": task, "writes": []map[string]any{{"channel": "c", "value": b64(task)}}}}}
}

// parentWriteCount is the number of pending writes of checkpoint id.
func (a *api) parentWriteCount(thread, id string) int {
	a.t.Helper()
	return len(a.do("GET", "/v1/threads/"+thread+"/checkpoints/"+id, nil).want(a.t, 200).JSON["pending_writes"].([]any))
}

// TestCheckpointCachedFenceLost: after fenced puts and writes that the
// server verified (and remembers), the lock released and then taken by
// another session: a put or a writes request under the old token is
// refused with the answer of a server that verifies each request, "not
// held ... (it is free)" then "(it is held with token N)", and nothing of
// it is stored, neither the checkpoint nor its parent's writes.
func TestCheckpointCachedFenceLost(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s, s2 := a.session(30), a.session(30)
	l := a.do("POST", "/v1/locks/thread-f", map[string]any{"session": s}).want(t, 200)
	tok := l.num("token")
	a.put("tf", map[string]any{"checkpoint_id": "c1", "state": b64("c1"), "lock": "thread-f", "session": s, "token": tok}).want(t, 201)
	a.put("tf", fencedPut("c2", "c1", "thread-f", s, tok, "t1")).want(t, 201)
	a.put("tf", fencedPut("c3", "c2", "thread-f", s, tok, "t2")).want(t, 201)
	writes := map[string]any{"task_id": "t3", "writes": []map[string]any{{"channel": "c", "value": b64("v")}}, "lock": "thread-f", "session": s, "token": tok}
	a.do("POST", "/v1/threads/tf/checkpoints/c3/writes", writes).want(t, 204)

	notHeld := func(now string) string {
		return fmt.Sprintf("lock: fenced out: lock %q is not held with token %d under session %s.… (%s): "+
			"the right this request names is no longer held (its session expired, or another holder took over); claim or acquire again",
			"thread-f", int64(tok), strings.Split(s, ".")[0], now)
	}
	a.do("DELETE", fmt.Sprintf("/v1/locks/thread-f?token=%d&session=%s&contender=%s", int64(tok), s, l.str("contender")), nil).want(t, 204)
	before := a.keyCount()
	for _, now := range []string{"it is free", ""} {
		if now == "" {
			tok2 := a.do("POST", "/v1/locks/thread-f", map[string]any{"session": s2}).want(t, 200).num("token")
			now, before = fmt.Sprintf("it is held with token %d", int64(tok2)), a.keyCount()
		}
		if p := a.put("tf", fencedPut("c4", "c3", "thread-f", s, tok, "t4")).problem(t, 409); p.str("detail") != notHeld(now) {
			t.Fatalf("a put under a lost lock: %s, want detail %q", p.Raw, notHeld(now))
		}
		if p := a.do("POST", "/v1/threads/tf/checkpoints/c3/writes", writes).problem(t, 409); p.str("detail") != notHeld(now) {
			t.Fatalf("writes under a lost lock: %s, want detail %q", p.Raw, notHeld(now))
		}
		if n := a.keyCount(); n != before || a.parentWriteCount("tf", "c3") != 1 {
			t.Fatalf("%s: refused writes stored something: %d keys, then %d; %d writes of c3", now, before, n, a.parentWriteCount("tf", "c3"))
		}
	}
	if h := a.do("GET", "/v1/threads/tf/head", nil).want(t, 200); h.str("checkpoint_id") != "c3" {
		t.Fatalf("the head: %s", h.Raw)
	}
}

// TestCheckpointCachedFenceWrongSecret: a put naming the lock's token and
// session lease with another secret is refused as the session not found
// (409), though the server remembers the lock verified under the right
// secret, and stores nothing; the right secret still writes.
func TestCheckpointCachedFenceWrongSecret(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.do("POST", "/v1/locks/thread-w", map[string]any{"session": s}).want(t, 200).num("token")
	a.put("tw", map[string]any{"checkpoint_id": "c1", "state": b64("c1"), "lock": "thread-w", "session": s, "token": tok}).want(t, 201)
	a.put("tw", fencedPut("c2", "c1", "thread-w", s, tok, "t1")).want(t, 201)
	lease, _, _ := strings.Cut(s, ".")
	wrong := lease + "." + strings.Repeat("0", 32)
	before := a.keyCount()
	p := a.put("tw", fencedPut("c3", "c2", "thread-w", wrong, tok, "t2")).problem(t, 409)
	if !strings.Contains(p.str("detail"), "the session ended") {
		t.Fatalf("a wrong secret: %s", p.Raw)
	}
	a.do("POST", "/v1/threads/tw/checkpoints/c2/writes", map[string]any{"task_id": "t2", "writes": []map[string]any{{"channel": "c"}},
		"lock": "thread-w", "session": wrong, "token": tok}).problem(t, 409)
	if n := a.keyCount(); n != before || a.parentWriteCount("tw", "c2") != 0 {
		t.Fatalf("a wrong secret stored something: %d keys, then %d", before, n)
	}
	a.put("tw", fencedPut("c3", "c2", "thread-w", s, tok, "t2")).want(t, 201)
	if a.parentWriteCount("tw", "c2") != 1 {
		t.Fatal("the parent's writes of the right secret's put were not stored")
	}
}
