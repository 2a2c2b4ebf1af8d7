package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// api is a real drover HTTP server on a loopback port, in a namespace of
// the test's own, with a client for it.
type api struct {
	t    *testing.T
	srv  *httpapi.Server
	base string // http://127.0.0.1:port
	ns   string
	cli  *clientv3.Client
	hc   *http.Client
	// token is sent as a bearer token when set.
	token string
}

// newAPI starts a server on the shared etcd, calling it in process as drover
// server's HTTP API does (tests that need a gRPC client, a server in front
// of a cluster, make their own); edit changes its config.
func newAPI(t *testing.T, edit ...func(*httpapi.Config)) *api {
	t.Helper()
	cli := srv.LocalClient(t)
	ns := etcdtest.Namespace(t)
	// A request timeout far above what etcd takes on a loaded machine:
	// tests of the timeout set their own.
	cfg := httpapi.Config{Etcd: cli, Namespace: ns, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		MaxWait: 10 * time.Second, RequestTimeout: time.Minute}
	for _, e := range edit {
		e(&cfg)
	}
	return startAPI(t, cfg)
}

// startAPI serves cfg on a loopback port until the test ends.
func startAPI(t *testing.T, cfg httpapi.Config) *api {
	t.Helper()
	s, err := httpapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l, "", "") }()
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := s.Close(ctx); err != nil {
			t.Error(err)
		}
		if err := <-done; err != nil {
			t.Error(err)
		}
		hc.CloseIdleConnections()
	})
	return &api{t: t, srv: s, base: "http://" + l.Addr().String(), ns: cfg.Namespace, cli: cfg.Etcd, hc: hc}
}

// resp is an answer: status, headers, raw body and the body decoded.
type resp struct {
	Status int
	Header http.Header
	Raw    []byte
	JSON   map[string]any
	List   []any
}

// do sends method path with body (a string is sent as is, anything else as
// JSON) and returns the answer; hdr adds headers ("Name: value").
func (a *api) do(method, path string, body any, hdr ...string) resp {
	a.t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		raw, err := json.Marshal(b)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	if a.token != "" {
		req.Header.Set("Authorization", "Bearer "+a.token)
	}
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	r, err := a.hc.Do(req)
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
	if out.JSON == nil {
		_ = json.Unmarshal(raw, &out.List)
	}
	return out
}

// want fails the test unless the answer has status code.
func (r resp) want(t *testing.T, code int) resp {
	t.Helper()
	if r.Status != code {
		t.Fatalf("status %d, want %d; body: %s", r.Status, code, r.Raw)
	}
	return r
}

// problem fails the test unless the answer is a problem document of
// status code, and returns it.
func (r resp) problem(t *testing.T, code int) resp {
	t.Helper()
	r.want(t, code)
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json; body: %s", ct, r.Raw)
	}
	if int(r.JSON["status"].(float64)) != code || r.JSON["detail"] == "" {
		t.Fatalf("problem without status or detail: %s", r.Raw)
	}
	return r
}

// str returns a string field of the decoded body.
func (r resp) str(k string) string { s, _ := r.JSON[k].(string); return s }

// num returns a number field of the decoded body.
func (r resp) num(k string) float64 { n, _ := r.JSON[k].(float64); return n }

// keyCount counts the keys under the test's namespace but the queue
// history's (see keyNames): a rejected request must leave it unchanged.
func (a *api) keyCount() int64 {
	a.t.Helper()
	root, hist := "/"+a.ns+"/", "/"+a.ns+"/queue-history/"
	resp, err := a.cli.Txn(context.Background()).Then(
		clientv3.OpGet(root, clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(hist, clientv3.WithPrefix(), clientv3.WithCountOnly())).Commit()
	if err != nil {
		a.t.Fatal(err)
	}
	return resp.Responses[0].GetResponseRange().Count - resp.Responses[1].GetResponseRange().Count
}

// keyNames lists the keys of the API's namespace but the queue history's:
// the server's recorder writes those on its own, every minute (its mark
// of the minute it closed), whatever the requests are.
func (a *api) keyNames() map[string]bool {
	a.t.Helper()
	g, err := a.cli.Get(context.Background(), "/"+a.ns+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		a.t.Fatal(err)
	}
	hist := "/" + a.ns + "/queue-history/"
	out := map[string]bool{}
	for _, kv := range g.Kvs {
		if !strings.HasPrefix(string(kv.Key), hist) {
			out[string(kv.Key)] = true
		}
	}
	return out
}

// keysChanged says which keys of before are gone and which are new.
func (a *api) keysChanged(before map[string]bool) string {
	a.t.Helper()
	after := a.keyNames()
	var gone, added []string
	for k := range before {
		if !after[k] {
			gone = append(gone, k)
		}
	}
	for k := range after {
		if !before[k] {
			added = append(added, k)
		}
	}
	if len(gone)+len(added) == 0 {
		return ""
	}
	return fmt.Sprintf("gone %v, added %v", gone, added)
}

// session creates a session of ttl seconds and returns its id.
func (a *api) session(ttl int) string {
	a.t.Helper()
	r := a.do("POST", "/v1/sessions", map[string]any{"ttl": ttl, "name": a.t.Name()}).want(a.t, 201)
	return r.str("id")
}
