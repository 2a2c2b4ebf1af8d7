package agentserver_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// srv is the embedded etcd every test shares; each test has a namespace.
var srv *etcdtest.Server

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, "", nil))
}

// api is drover's whole HTTP API on a loopback port, the Agent Server's
// routes mounted as drover server mounts them.
type api struct {
	t    testing.TB
	base string
	hc   *http.Client
	// hdr is sent with every request.
	hdr http.Header
	// cli is the server's etcd client, ns its namespace.
	cli *clientv3.Client
	ns  string
}

func newAPI(t testing.TB, edit ...func(*httpapi.Config)) *api {
	t.Helper()
	cli := srv.LocalClient(t)
	cfg := httpapi.Config{Etcd: cli, Namespace: etcdtest.Namespace(t), Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(), RequestTimeout: time.Minute}
	for _, e := range edit {
		e(&cfg)
	}
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
	hc := &http.Client{Timeout: 30 * time.Second}
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
	// drover's clients ask for JSON, and so get problems (plaintext.go).
	return &api{t: t, base: "http://" + l.Addr().String(), hc: hc, hdr: http.Header{"Accept": {"application/json, application/problem+json"}}, cli: cli, ns: cfg.Namespace}
}

// answer is a response: status, headers and body decoded.
type answer struct {
	Status int
	Header http.Header
	Obj    map[string]any
	List   []map[string]any
	Raw    string
}

// do sends body as JSON (nil sends none) and decodes the answer.
func (a *api) do(method, path string, body any) answer {
	a.t.Helper()
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			a.t.Fatal(err)
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, a.base+path, rd)
	if err != nil {
		a.t.Fatal(err)
	}
	req.Header = a.hdr.Clone()
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		a.t.Fatal(err)
	}
	ans := answer{Status: resp.StatusCode, Header: resp.Header, Raw: string(raw)}
	if len(raw) > 0 && raw[0] == '[' {
		_ = json.Unmarshal(raw, &ans.List)
	} else if len(raw) > 0 {
		_ = json.Unmarshal(raw, &ans.Obj)
	}
	return ans
}

// must is do, failing the test unless the status is want.
func (a *api) must(want int, method, path string, body any) answer {
	a.t.Helper()
	ans := a.do(method, path, body)
	if ans.Status != want {
		a.t.Fatalf("%s %s: status %d, want %d: %s", method, path, ans.Status, want, ans.Raw)
	}
	return ans
}

// errorAt reports whether a problem names location among its errors.
func errorAt(ans answer, location string) bool {
	errs, _ := ans.Obj["errors"].([]any)
	for _, e := range errs {
		m, _ := e.(map[string]any)
		msg, _ := m["message"].(string)
		if m["location"] == location || (m["location"] == "body" && strings.Contains(msg, location[strings.LastIndex(location, ".")+1:])) {
			return true
		}
	}
	return false
}
