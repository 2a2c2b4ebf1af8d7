package httpapi_test

import (
	"os"
	"testing"
)

// TestSessionNameNotUTF8: a session's name or host that is not UTF-8
// (bytes, or an escape of a lone surrogate) is refused with a 400 naming
// the field, where encoding/json would replace it with U+FFFD; a U+FFFD
// the request spells is text like any other.
func TestSessionNameNotUTF8(t *testing.T) {
	a := newAPI(t)
	for _, tc := range []struct{ body, where string }{
		{"{\"ttl\":10,\"name\":\"worker-\xff\xfe\"}", "body.name"},
		{`{"ttl":10,"name":"worker-\ud800"}`, "body.name"},
		{"{\"ttl\":10,\"name\":\"w\",\"host\":\"box\xc3\"}", "body.host"},
	} {
		before := a.keyCount()
		r := a.do("POST", "/v1/sessions", tc.body).problem(t, 400)
		if d := r.JSON["errors"].([]any)[0].(map[string]any); d["location"] != tc.where || d["message"] == "" {
			t.Fatalf("%q: the problem does not name %s with its rule: %s", tc.body, tc.where, r.Raw)
		}
		if after := a.keyCount(); after != before {
			t.Fatalf("%q: %d keys before, %d after a refused session", tc.body, before, after)
		}
	}
	r := a.do("POST", "/v1/sessions", `{"ttl":10,"name":"w \ufffd `+"\uFFFD"+`"}`).want(t, 201)
	if r.str("name") != "w \uFFFD \uFFFD" {
		t.Fatalf("name %q", r.str("name"))
	}
}

// TestLockHolderIsTheSession: a lock taken under a session shows the
// session's own name, host and pid as its holder, not the server's; a
// session without a name is named by its host and pid; an owner lock by
// its owner, with no host of the server's.
func TestLockHolderIsTheSession(t *testing.T) {
	a := newAPI(t)
	server, _ := os.Hostname()
	sid := a.do("POST", "/v1/sessions", map[string]any{"ttl": 10, "name": "agent-7", "host": "box-3", "pid": 4242}).want(t, 201).str("id")
	anon := a.do("POST", "/v1/sessions", map[string]any{"ttl": 10, "host": "box-4", "pid": 7}).want(t, 201).str("id")
	for _, tc := range []struct {
		lock string
		body map[string]any
		id   string
		host string
		pid  float64
	}{
		{"named", map[string]any{"session": sid}, "agent-7", "box-3", 4242},
		{"anonymous", map[string]any{"session": anon}, "box-4:7", "box-4", 7},
		{"owned", map[string]any{"owner": "worker-9", "ttl": 30}, "worker-9", "", 0},
	} {
		acq := a.do("POST", "/v1/locks/"+tc.lock, tc.body).want(t, 200)
		for _, h := range []map[string]any{
			acq.JSON["holder"].(map[string]any),
			a.do("GET", "/v1/locks/"+tc.lock, nil).want(t, 200).JSON["holder"].(map[string]any),
			a.do("GET", "/v1/locks/"+tc.lock+"/waiters", nil).want(t, 200).JSON["holder"].(map[string]any)["holder"].(map[string]any),
		} {
			if h["id"] != tc.id || h["host"] != tc.host || h["pid"] != tc.pid || (server != "" && h["host"] == server) {
				t.Fatalf("%s: holder %v, want id %s, host %q, pid %v", tc.lock, h, tc.id, tc.host, tc.pid)
			}
		}
	}
}
