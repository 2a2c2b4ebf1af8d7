package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestSessionLifecycle: a session is created with its TTL, read, kept
// alive and deleted; a deleted one is 404 on every route, and so is one of
// another namespace.
func TestSessionLifecycle(t *testing.T) {
	a := newAPI(t)
	r := a.do("POST", "/v1/sessions", map[string]any{"ttl": 5, "name": "worker-1"}).want(t, 201)
	id := r.str("id")
	if id == "" || r.num("ttl") != 5 || r.str("name") != "worker-1" {
		t.Fatalf("created: %s", r.Raw)
	}
	exp, err := time.Parse(time.RFC3339Nano, r.str("expires_at"))
	if err != nil || time.Until(exp) < 3*time.Second || time.Until(exp) > 6*time.Second {
		t.Fatalf("expires_at %q (%v)", r.str("expires_at"), err)
	}
	a.do("GET", "/v1/sessions/"+id, nil).want(t, 200)
	a.do("POST", "/v1/sessions/"+id+"/keepalive", nil).want(t, 200)

	other := newAPI(t)
	other.do("GET", "/v1/sessions/"+id, nil).problem(t, 404)
	other.do("POST", "/v1/sessions/"+id+"/keepalive", nil).problem(t, 404)

	a.do("DELETE", "/v1/sessions/"+id, nil).want(t, 204)
	for _, p := range []string{"GET /v1/sessions/" + id, "POST /v1/sessions/" + id + "/keepalive", "DELETE /v1/sessions/" + id} {
		var m, path string
		fmt.Sscan(p, &m, &path)
		a.do(m, path, nil).problem(t, 404)
	}
}

// TestSessionExpires: a session without keepalives ends within TTL + 1 s,
// and a keepalive then gets 404.
func TestSessionExpires(t *testing.T) {
	a := newAPI(t)
	id := a.session(2)
	start := time.Now()
	for a.do("GET", "/v1/sessions/"+id, nil).Status == 200 {
		if time.Since(start) > 4*time.Second {
			t.Fatal("session still alive 4 s after its 2 s TTL")
		}
		time.Sleep(100 * time.Millisecond)
	}
	a.do("POST", "/v1/sessions/"+id+"/keepalive", nil).problem(t, 404)
}

// TestSessionSecret: a session id is its lease and a secret; the lease
// with another secret is no session: 404 on the session's routes and on a
// lock acquisition, 409 on an outcome under it, and nothing is written.
func TestSessionSecret(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	id := a.session(10)
	lease, secret, ok := strings.Cut(id, ".")
	if !ok || len(secret) < 16 {
		t.Fatalf("session id %q is not lease.secret", id)
	}
	forged := lease + "." + strings.Repeat("a", len(secret))
	a.do("GET", "/v1/sessions/"+id, nil).want(t, 200)
	before := a.keyCount()
	a.do("GET", "/v1/sessions/"+forged, nil).problem(t, 404)
	a.do("POST", "/v1/sessions/"+forged+"/keepalive", nil).problem(t, 404)
	a.do("DELETE", "/v1/sessions/"+forged, nil).problem(t, 404)
	r := a.do("POST", "/v1/locks/secret", map[string]any{"session": forged}).problem(t, 404)
	if strings.Contains(string(r.Raw), secret[:8]) || strings.Contains(string(r.Raw), "aaaaaaaa") {
		t.Fatalf("a problem echoes a session secret: %s", r.Raw)
	}
	a.do("POST", "/v1/queues/q/tasks/t1/ack", map[string]any{"session": forged, "token": 5}).problem(t, 409)
	a.do("POST", "/v1/sessions/"+lease+"/keepalive", nil).problem(t, 400)
	if n := a.keyCount(); n != before {
		t.Fatalf("%d keys before, %d after requests with a forged session", before, n)
	}
	a.do("GET", "/v1/sessions/"+id, nil).want(t, 200)
}
