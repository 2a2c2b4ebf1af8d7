package httpapi_test

import (
	"log/slog"
	"net/url"
	"strings"
	"testing"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestSessionSecretsNotRepeated: no error and no access log line repeats
// a session id's secret, when the id is in the path: a malformed id of a
// session route, a route that does not exist under a session, a refused
// cross-origin write, and the session routes' own answers in the log.
func TestSessionSecretsNotRepeated(t *testing.T) {
	t.Parallel()
	var logs etcdtest.LogBuffer
	a := newAPI(t, func(c *httpapi.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	sid := a.session(10)
	lease, secret, _ := strings.Cut(sid, ".")
	esc := url.PathEscape(sid)
	for _, c := range []struct {
		method, path string
		hdr          []string
		status       int
	}{
		{"GET", "/v1/sessions/" + esc, nil, 200},
		{"POST", "/v1/sessions/" + esc + "/keepalive", nil, 200},
		{"GET", "/v1/sessions/" + esc + "%20", nil, 400},
		{"GET", "/v1/sessions/" + esc + "x", nil, 404},
		{"GET", "/v1/sessions/" + secret, nil, 400},
		{"GET", "/v1/sessions/zz." + secret, nil, 400},
		{"GET", "/v1/sessions/" + esc + "/nope", nil, 404},
		{"PATCH", "/v1/sessions/" + esc, nil, 405},
		{"DELETE", "/v1/sessions/" + esc, []string{"Origin: https://evil.example"}, 403},
	} {
		r := a.do(c.method, c.path, nil, c.hdr...).want(t, c.status)
		if r.Status >= 400 && strings.Contains(string(r.Raw), secret) { // a session's own answers name it
			t.Fatalf("%s %s: the answer repeats the secret: %s", c.method, c.path, r.Raw)
		}
	}
	out := logs.String()
	if strings.Contains(out, secret) {
		t.Fatalf("the access log holds a session's secret:\n%s", out)
	}
	if n := strings.Count(out, "path=/v1/sessions/"+lease+".…"); n < 3 {
		t.Fatalf("the access log names the session by its lease %d times, want 3 or more:\n%s", n, out)
	}
	a.do("DELETE", "/v1/sessions/"+esc, nil).want(t, 204)
}

// TestSessionIDPatternIsTheRoutes: the pattern scrub knows session ids by
// is the one the session routes' documents give path.id.
func TestSessionIDPatternIsTheRoutes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("GET", "/healthz", nil).want(t, 200) // serving before the test ends
	op := a.srv.API().OpenAPI().Paths["/v1/sessions/{id}"].Get
	for _, p := range op.Parameters {
		if p.Name == "id" && p.Schema.Pattern != httpapi.SessionIDPattern {
			t.Fatalf("path.id's pattern %q, scrub's %q", p.Schema.Pattern, httpapi.SessionIDPattern)
		}
	}
}
