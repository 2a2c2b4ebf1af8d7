package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
)

// The fuzz targets of this package send fuzzed request bodies through the
// real handler (huma's decoding and validation, then the route's own
// checks) on the package's embedded etcd, with httptest: no sockets.

// fuzzAPI is a server for a fuzz target, in a namespace of its own, with
// long polls cut short.
type fuzzAPI struct {
	srv *httpapi.Server
	h   http.Handler
	ns  string
}

// fuzzWait is the server's longest wait: a fuzzed ?wait= never blocks an
// input for long.
const fuzzWait = 20 * time.Millisecond

// newFuzzAPI starts a server for f's inputs; it is closed when f ends.
func newFuzzAPI(f *testing.F) *fuzzAPI {
	f.Helper()
	cfg := httpapi.Config{Etcd: srv.Client(f), Namespace: etcdtest.Namespace(f), Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(), MaxWait: fuzzWait, RequestTimeout: time.Minute}
	s, err := httpapi.New(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			f.Error(err)
		}
	})
	return &fuzzAPI{srv: s, h: s.Handler(), ns: cfg.Namespace}
}

// problemDoc is the part of a problem document the targets check.
type problemDoc struct {
	Type   string `json:"type"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	Errors []struct {
		Location string `json:"location"`
		Message  string `json:"message"`
	} `json:"errors"`
	Lines []struct {
		Line  int    `json:"line"`
		Error string `json:"error"`
	} `json:"lines"`
}

// answer is a response: its status, body, and the problem it holds when
// it is not a success.
type answer struct {
	Status int
	Raw    []byte
	Prob   problemDoc
	// Unrouted is set on the router's own 404, when no route matched.
	Unrouted bool
}

// send serves one request and checks what every answer must be: no
// server error (etcd is up, no request nears its minute's bound), and
// every error a problem document of its status with a detail, whose 400s
// name each input at fault by its location in the request.
func (a *fuzzAPI) send(t testing.TB, method, target, contentType string, body []byte) answer {
	t.Helper()
	req := httptest.NewRequest(method, target, bytes.NewReader(body))
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	rec := httptest.NewRecorder()
	a.h.ServeHTTP(rec, req)
	ans := answer{Status: rec.Code, Raw: rec.Body.Bytes()}
	if ans.Status >= 500 {
		t.Fatalf("%s %s %q: server error: %s", method, target, body, ans.Raw)
	}
	if ans.Status < 400 {
		return ans
	}
	ct := rec.Header().Get("Content-Type")
	if ct != "application/problem+json" {
		t.Fatalf("%s %s %q: %d with Content-Type %q: %s", method, target, body, ans.Status, ct, ans.Raw)
	}
	if err := json.Unmarshal(ans.Raw, &ans.Prob); err != nil || ans.Prob.Status != ans.Status || ans.Prob.Detail == "" {
		t.Fatalf("%s %s %q: %d, not a problem of its status with a detail (%v): %s", method, target, body, ans.Status, err, ans.Raw)
	}
	if ans.Status == http.StatusNotFound && strings.HasSuffix(ans.Prob.Type, "/no-route") && strings.Contains(target, "%2F") {
		// The router's own 404: a path segment of escaped slashes only
		// ("/v1/locks/%2F") matches no route, and no route's code runs.
		ans.Unrouted = true
		return ans
	}
	if ans.Status == http.StatusBadRequest {
		checkLocations(t, method+" "+target, body, ans)
	}
	return ans
}

// checkLocations fails t unless a 400 lists the inputs at fault, each by
// its place in the request (body, body.ttl, body[3], path.name,
// query.wait, header.X), and its detail names the first (a submission's
// rejected tasks are listed in lines instead), or, listing none, names
// the body.
func checkLocations(t testing.TB, req string, body []byte, ans answer) {
	t.Helper()
	p := ans.Prob
	if len(p.Errors) == 0 {
		// huma's own rejections of a whole body ("request body is
		// required") list nothing: the detail names the body.
		if !strings.Contains(p.Detail, "body") {
			t.Fatalf("%s %q: 400 that names no input at fault: %s", req, body, ans.Raw)
		}
		return
	}
	for _, e := range p.Errors {
		if !locatedInRequest(e.Location) {
			t.Fatalf("%s %q: 400 at %q, which is no place in a request: %s", req, body, e.Location, ans.Raw)
		}
	}
	if len(p.Lines) == 0 && !strings.Contains(p.Detail, p.Errors[0].Location) {
		t.Fatalf("%s %q: 400 whose detail does not name %s: %s", req, body, p.Errors[0].Location, ans.Raw)
	}
}

// do sends a JSON body given as a string.
func (a *fuzzAPI) do(t testing.TB, method, target, body string) answer {
	t.Helper()
	return a.send(t, method, target, "application/json", []byte(body))
}

// locatedInRequest reports whether loc names a place in a request.
func locatedInRequest(loc string) bool {
	// "body." is the body's field named "" ({"":0}).
	if loc == "body" || strings.HasPrefix(loc, "body[") || strings.HasPrefix(loc, "body.") {
		return true
	}
	for _, part := range []string{"path.", "query.", "header."} {
		if strings.HasPrefix(loc, part) && len(loc) > len(part) {
			return true
		}
	}
	return false
}

// hasLocation reports whether a 400 names location loc, or a place in it
// (body.outcomes[0].ok is in body.outcomes).
func (ans answer) hasLocation(loc string) bool {
	for _, e := range ans.Prob.Errors {
		if e.Location == loc || strings.HasPrefix(e.Location, loc+".") || strings.HasPrefix(e.Location, loc+"[") {
			return true
		}
	}
	return false
}

// decodeObject reads body as one JSON object, false when it is not one.
func decodeObject(body []byte) (map[string]json.RawMessage, bool) {
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(body, &obj); err != nil || obj == nil {
		return nil, false
	}
	return obj, true
}

// fieldOf is the value of obj's field name, and whether the body names it
// plainly: false when keys differing in case only (which the decoding
// matches too) make it unclear which one counts.
func fieldOf(obj map[string]json.RawMessage, name string) (json.RawMessage, bool) {
	n := 0
	for k := range obj {
		if strings.EqualFold(k, name) {
			n++
		}
	}
	v, exact := obj[name]
	return v, n == 0 || n == 1 && exact
}
