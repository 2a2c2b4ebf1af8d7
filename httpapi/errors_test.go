package httpapi_test

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// sendRaw sends body to path with Content-Type ct ("" sends none) and
// returns the answer, without following redirects.
func (a *api) sendRaw(method, path, ct, body string) resp {
	a.t.Helper()
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if err != nil {
		a.t.Fatal(err)
	}
	if body == "" {
		req.Body = nil
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	hc := &http.Client{Transport: a.hc.Transport, Timeout: a.hc.Timeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	r, err := hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	out := resp{Status: r.StatusCode, Header: r.Header, Raw: raw}
	_ = json.Unmarshal(raw, &out.JSON)
	return out
}

// TestUnroutedAreProblems: an unknown path answers a 404 problem, a known
// path with another method a 405 problem with Allow; the dashboard and its
// redirects still answer.
func TestUnroutedAreProblems(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.sendRaw("GET", "/v1/nope", "", "").problem(t, 404)
	if !strings.HasSuffix(r.str("type"), "/no-route") || r.str("instance") != "/v1/nope" {
		t.Fatalf("404: %s", r.Raw)
	}
	r = a.sendRaw("PATCH", "/v1/queues", "", "").problem(t, 405)
	if allow := r.Header.Get("Allow"); !strings.Contains(allow, "GET") || !strings.Contains(r.str("detail"), allow) ||
		!strings.HasSuffix(r.str("type"), "/method-not-allowed") {
		t.Fatalf("405 with Allow %q: %s", allow, r.Raw)
	}
	a.sendRaw("DELETE", "/v1/sessions", "", "").problem(t, 405)
	if r := a.sendRaw("GET", "/ui/", "", "").want(t, 200); !strings.HasPrefix(r.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("/ui/: %s", r.Header.Get("Content-Type"))
	}
	for _, p := range []string{"/", "/ui"} {
		if r := a.sendRaw("GET", p, "", "").want(t, 302); r.Header.Get("Location") != "/ui/" {
			t.Fatalf("%s redirects to %q", p, r.Header.Get("Location"))
		}
	}
}

// TestJSONBodyWithoutJSONContentType: a JSON body sent without a
// Content-Type, or as curl -d's form, is read as JSON; any other type is a
// 415 problem naming the header to send; and no error repeats a body or
// a session's secret.
func TestJSONBodyWithoutJSONContentType(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, ct := range []string{"", "application/x-www-form-urlencoded"} {
		r := a.sendRaw("POST", "/v1/sessions", ct, `{"ttl": 10, "name": "curl"}`)
		if r.Status != 201 || r.str("id") == "" {
			t.Fatalf("Content-Type %q: %d %s", ct, r.Status, r.Raw)
		}
	}
	sid := a.session(10)
	_, secret, _ := strings.Cut(sid, ".")
	step := `{"session": "` + sid + `", "state": {"n": 1}}`
	if r := a.sendRaw("PUT", "/v1/agent-tasks/report-42/steps/1", "application/x-www-form-urlencoded", step); r.Status == 415 ||
		strings.Contains(string(r.Raw), secret) {
		t.Fatalf("a step sent with curl -d: %d %s", r.Status, r.Raw)
	}
	r := a.sendRaw("PUT", "/v1/agent-tasks/report-42/steps/1", "text/plain", step).problem(t, 415)
	if !strings.HasSuffix(r.str("type"), "/unsupported-media-type") || !strings.Contains(r.str("detail"), "Content-Type: application/json") {
		t.Fatalf("415: %s", r.Raw)
	}
	for _, c := range []struct {
		what, path, body string
	}{
		{"415", "/v1/agent-tasks/report-42/steps/1", step},
		{"malformed JSON", "/v1/agent-tasks/report-42/steps/1", `{"session": "` + sid + `", `},
		{"a malformed session id", "/v1/locks/x", `{"session": "zz.` + secret + `"}`},
		{"a session of the wrong type", "/v1/locks/x", `{"session": ["` + sid + `"]}`},
	} {
		ct := "application/json"
		if c.what == "415" {
			ct = "text/plain"
		}
		method := "PUT"
		if strings.HasPrefix(c.path, "/v1/locks") {
			method = "POST"
		}
		r := a.sendRaw(method, c.path, ct, c.body)
		if r.Status < 400 || r.Header.Get("Content-Type") != "application/problem+json" || r.str("type") == "" {
			t.Fatalf("%s: %d %s", c.what, r.Status, r.Raw)
		}
		if strings.Contains(string(r.Raw), secret) {
			t.Fatalf("%s: the answer repeats the session's secret: %s", c.what, r.Raw)
		}
	}
}

// TestAccessLogNamesNamespaceAndToken: the access log line of a request
// names the namespace it named, whether it was allowed to use it, and its
// token's name, never the token, on success and on refusal alike; a
// namespace that is no valid name is not logged.
func TestAccessLogNamesNamespaceAndToken(t *testing.T) {
	t.Parallel()
	var logs etcdtest.LogBuffer
	other := etcdtest.Namespace(t) + "-team"
	const tok = "agents-token-0123456789abcdef"
	a := newAPI(t, func(c *httpapi.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{{Name: "agents", Token: tok, Namespaces: []string{other}, Role: "write"}})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	a.token = tok
	a.do("GET", "/v1/queues", nil, httpapi.NamespaceHeader+": "+other).want(t, 200)
	a.do("GET", "/v1/queues", nil).problem(t, 403) // the server's namespace, not the token's
	a.do("GET", "/v1/whoami", nil).want(t, 200)    // any namespace, allowed or not
	a.do("GET", "/v1/queues", nil, httpapi.NamespaceHeader+": bad ns!").problem(t, 400)
	a.token = ""
	a.do("GET", "/v1/queues", nil, httpapi.NamespaceHeader+": "+other).problem(t, 401)
	a.do("GET", "/v1/queues", nil, httpapi.NamespaceHeader+": bad ns!").problem(t, 401)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	want := []struct {
		ns, token string
		allowed   bool
	}{{other, "agents", true}, {a.ns, "agents", false}, {a.ns, "agents", false}, {"", "agents", false}, {other, "", false}, {"", "", false}}
	if len(lines) != len(want) {
		t.Fatalf("access log:\n%s", logs.String())
	}
	for i, w := range want {
		ns := w.ns
		if ns == "" {
			ns = `""`
		}
		if !strings.Contains(lines[i], "namespace="+ns+" ") || !strings.Contains(lines[i], "token="+w.token) ||
			!strings.Contains(lines[i], fmt.Sprintf("namespace_allowed=%t ", w.allowed)) {
			t.Fatalf("line %d names not namespace %q (allowed %t) and token %q: %s", i+1, w.ns, w.allowed, w.token, lines[i])
		}
	}
	if strings.Contains(logs.String(), tok) || strings.Contains(logs.String(), "bad ns") {
		t.Fatalf("the access log holds the token or an invalid namespace:\n%s", logs.String())
	}
}
