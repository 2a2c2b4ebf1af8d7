package httpapi_test

import (
	"strings"
	"testing"
)

// TestCrossOriginWritesRefused: a browser's write from another origin (a
// form post, which needs no preflight) is refused with a 403 problem and
// changes nothing, whatever its Content-Type; the same request from curl
// (no Origin, no Sec-Fetch-Site) or from the server's own pages (the
// dashboard) goes through, and reads from anywhere too.
func TestCrossOriginWritesRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	form := "Content-Type: application/x-www-form-urlencoded"
	for _, c := range []struct{ path, body string }{
		{"/v1/queues/q/tasks", `[{"task_id": "t1", "task_type": "x"}]`},
		{"/v1/sessions", `{"ttl": 10}`},
	} {
		for _, hdr := range [][]string{
			{"Origin: https://evil.example", form},
			{"Origin: https://evil.example", "Content-Type: text/plain"},
			{"Sec-Fetch-Site: cross-site", form},
			{"Sec-Fetch-Site: same-site", "Origin: https://other.example", form},
		} {
			before := a.keyCount()
			r := a.do("POST", c.path, c.body, hdr...).problem(t, 403)
			if !strings.HasSuffix(r.str("type"), "/cross-origin") || !strings.Contains(r.str("detail"), "origin") {
				t.Fatalf("POST %s %v: %s", c.path, hdr, r.Raw)
			}
			if n := a.keyCount(); n != before {
				t.Fatalf("POST %s %v: refused, but the keys went from %d to %d", c.path, hdr, before, n)
			}
		}
	}
	a.do("POST", "/v1/sessions", `{"ttl": 10}`, form).want(t, 201) // curl -d
	a.do("POST", "/v1/sessions", `{"ttl": 10}`, "Origin: "+a.base).want(t, 201)
	a.do("POST", "/v1/sessions", `{"ttl": 10}`, "Sec-Fetch-Site: same-origin", "Origin: "+a.base).want(t, 201)
	a.do("POST", "/v1/queues/q/tasks", `[{"task_id": "t1", "task_type": "x"}]`, "Sec-Fetch-Site: same-origin").want(t, 200)
	a.do("GET", "/v1/queues", nil, "Origin: https://evil.example", "Sec-Fetch-Site: cross-site").want(t, 200)
}
