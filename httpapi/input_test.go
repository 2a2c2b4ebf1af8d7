package httpapi_test

import (
	"strings"
	"testing"
)

// TestBadInputSessionsAndLocks: each class of bad input on the session
// and lock routes gets a 400 (or 413) problem naming the input at fault,
// and writes nothing.
func TestBadInputSessionsAndLocks(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	sid := a.session(10)
	huge := `{"name":"` + strings.Repeat("x", 2<<20) + `"}`
	for _, tc := range []struct {
		name, method, path string
		body               any
		code               int
		where              string // a location the problem must name
	}{
		{"malformed json", "POST", "/v1/sessions", `{"ttl": 5`, 400, ""},
		{"wrong type", "POST", "/v1/sessions", `{"ttl": "five"}`, 400, "body.ttl"},
		{"unknown field", "POST", "/v1/sessions", `{"ttl": 5, "tll": 5}`, 400, "body.tll"},
		{"ttl out of range", "POST", "/v1/sessions", `{"ttl": 0.5}`, 400, "body.ttl"},
		{"ttl too long", "POST", "/v1/sessions", `{"ttl": 100000}`, 400, "body.ttl"},
		{"oversize", "POST", "/v1/sessions", huge, 413, ""},
		{"bad session id", "POST", "/v1/sessions/not-hex/keepalive", nil, 400, "path.id"},
		{"lock: malformed json", "POST", "/v1/locks/a", `{"session": `, 400, ""},
		{"lock: wrong type", "POST", "/v1/locks/a", `{"session": 12}`, 400, "body.session"},
		{"lock: unknown field", "POST", "/v1/locks/a", `{"session": "` + sid + `", "sesion": 1}`, 400, "body.sesion"},
		{"lock: invalid name", "POST", "/v1/locks/a%20b", `{"session": "` + sid + `"}`, 400, "path.name"},
		{"lock: name too long", "POST", "/v1/locks/" + strings.Repeat("n", 129), `{"session": "` + sid + `"}`, 400, "path.name"},
		{"lock: neither session nor owner", "POST", "/v1/locks/a", `{}`, 400, "body"},
		{"lock: session and owner", "POST", "/v1/locks/a", `{"session": "` + sid + `", "owner": "x", "ttl": 5}`, 400, "body.session"},
		{"lock: owner without ttl", "POST", "/v1/locks/a", `{"owner": "x"}`, 400, "body"},
		{"lock: bad wait", "POST", "/v1/locks/a?wait=soon", `{"session": "` + sid + `"}`, 400, "query.wait"},
		{"lock: bad session", "POST", "/v1/locks/a", `{"session": "zz"}`, 400, "body.session"},
		{"release: no token", "DELETE", "/v1/locks/a?session=" + sid, nil, 400, "query.token"},
		{"release: token not a number", "DELETE", "/v1/locks/a?token=x&session=" + sid, nil, 400, "query.token"},
		{"release: no contender", "DELETE", "/v1/locks/a?token=5&session=" + sid, nil, 400, "query.contender"},
		{"release: neither session nor owner", "DELETE", "/v1/locks/a?token=5&contender=000000000000001f-abcdefghabcdefgh-0", nil, 400, "query.session"},
		{"release: bad contender", "DELETE", "/v1/locks/a?token=5&contender=nothex-0", nil, 400, "query.contender"},
		{"lock: a task runner's lock", "POST", "/v1/locks/task:job-1", `{"session": "` + sid + `"}`, 400, "path.name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := a.keyCount()
			r := a.do(tc.method, tc.path, tc.body).problem(t, tc.code)
			if tc.where != "" && !strings.Contains(string(r.Raw), `"location":"`+tc.where) {
				t.Fatalf("the problem does not name %s: %s", tc.where, r.Raw)
			}
			if after := a.keyCount(); after != before {
				t.Fatalf("%d keys before, %d after a rejected request", before, after)
			}
		})
	}
}
