package budget_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
)

// serve starts drover's HTTP API on a loopback port until the test ends and
// returns its base URL.
func serve(t *testing.T) string {
	t.Helper()
	return serveNS(t, etcdtest.Namespace(t))
}

// serveNS is serve for namespace ns.
func serveNS(t *testing.T, ns string) string {
	t.Helper()
	cfg := httpapi.Config{Etcd: srv.LocalClient(t), Namespace: ns, Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(), MaxWait: 10 * time.Second, RequestTimeout: time.Minute}
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
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
		<-done
		http.DefaultClient.CloseIdleConnections()
	})
	return "http://" + l.Addr().String()
}

// call sends body (nil: none) and returns the status, headers and decoded
// answer.
func call(t *testing.T, method, url string, body any) (int, http.Header, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, url, rd)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	b, _ := io.ReadAll(resp.Body)
	if len(b) > 0 {
		if err := json.Unmarshal(b, &out); err != nil {
			t.Fatalf("%s %s: %s: %v", method, url, b, err)
		}
	}
	if resp.StatusCode >= 400 && !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		t.Fatalf("%s %s: %d answered as %s, want a problem", method, url, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return resp.StatusCode, resp.Header, out
}

// TestHTTPReserveSettle: the routes set, reserve, settle, get, list and
// delete a budget whose key holds '/', and answer bad input, a spent
// budget and a settled reservation with problems (400, 429 with
// Retry-After, 409).
func TestHTTPReserveSettle(t *testing.T) {
	base := serve(t) + "/v1/budgets/"
	b := base + url.PathEscape(key)
	if code, _, out := call(t, http.MethodPut, b, map[string]any{"tokens": 1000, "window_seconds": 86400,
		"weights": map[string]float64{"acme": 1}, "caps": map[string]int64{"small": 100}}); code != 200 || out["key"] != key {
		t.Fatalf("set: %d %v", code, out)
	}
	code, _, res := call(t, http.MethodPost, b+"/reserve", map[string]any{"tenant": "acme", "estimate": 600})
	if code != 201 || res["estimate"] != 600.0 || res["own_lease"] != true {
		t.Fatalf("reserve: %d %v", code, res)
	}
	code, h, p := call(t, http.MethodPost, b+"/reserve", map[string]any{"tenant": "acme", "estimate": 500})
	if code != 429 || h.Get("Retry-After") == "" {
		t.Fatalf("reserve beyond the budget: %d %v %v, want 429 with Retry-After", code, h, p)
	}
	settle := b + "/reservations/" + res["id"].(string) + "/settle"
	if code, _, out := call(t, http.MethodPost, settle, map[string]any{"actual": 400,
		"headers": map[string]string{"x-ratelimit-remaining-tokens": "100000"}}); code != 200 || out["difference"] != -200.0 {
		t.Fatalf("settle: %d %v", code, out)
	}
	if code, _, out := call(t, http.MethodPost, settle, map[string]any{"actual": 400}); code != 409 {
		t.Fatalf("second settle: %d %v, want 409", code, out)
	}
	if code, _, out := call(t, http.MethodGet, b, nil); code != 200 || out["used"] != 400.0 || out["remaining"] != 600.0 {
		t.Fatalf("get: %d %v", code, out)
	}
	_, _, held := call(t, http.MethodPost, b+"/reserve", map[string]any{"estimate": 10, "ttl_seconds": 30})
	live := b + "/reservations/" + held["id"].(string) + "/settle"
	for _, c := range []struct {
		name, method, url string
		body              any
		want              int
		location          string
	}{
		{"negative estimate", http.MethodPost, b + "/reserve", map[string]any{"estimate": -1}, 400, "body.estimate"},
		{"estimate above the budget", http.MethodPost, b + "/reserve", map[string]any{"estimate": 5000}, 400, "body.estimate"},
		{"estimate above the tenant's cap", http.MethodPost, b + "/reserve", map[string]any{"tenant": "small", "estimate": 101}, 400, "body.estimate"},
		{"settle of an unknown reservation", http.MethodPost, b + "/reservations/0123456789abcdef01234567/settle", map[string]any{"actual": 1}, 409, ""},
		{"settle above the bound", http.MethodPost, live, map[string]any{"actual": 1001}, 400, "body.actual"},
		{"negative settle", http.MethodPost, live, map[string]any{"actual": -1}, 400, "body.actual"},
		{"zero weight", http.MethodPut, b, map[string]any{"tokens": 10, "weights": map[string]float64{"x": 0}}, 400, "body.weights.x"},
		{"bad provider header", http.MethodPost, live, map[string]any{"actual": 1,
			"headers": map[string]string{"x-ratelimit-remaining-tokens": "lots"}}, 400, "body.headers.x-ratelimit-remaining-tokens"},
		{"bad key", http.MethodGet, base + "no%20spaces", nil, 400, "path.key"},
		{"unknown budget", http.MethodPost, base + "a%2Fb/reserve", map[string]any{"estimate": 1}, 404, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, _, p := call(t, c.method, c.url, c.body)
			if code != c.want {
				t.Fatalf("%d %v, want %d", code, p, c.want)
			}
			if c.location != "" {
				errs, _ := p["errors"].([]any)
				if len(errs) == 0 || errs[0].(map[string]any)["location"] != c.location {
					t.Fatalf("problem %v, want the location %s", p, c.location)
				}
			}
		})
	}
	if code, _, out := call(t, http.MethodGet, strings.TrimSuffix(base, "/"), nil); code != 200 || len(out["data"].([]any)) != 1 {
		t.Fatalf("list: %d %v", code, out)
	}
	if code, _, out := call(t, http.MethodPost, live, map[string]any{"actual": 10}); code != 200 {
		t.Fatalf("settle after refused settles: %d %v", code, out)
	}
	if code, _, _ := call(t, http.MethodDelete, b, nil); code != 204 {
		t.Fatalf("delete: %d", code)
	}
	if code, _, _ := call(t, http.MethodGet, b, nil); code != 404 {
		t.Fatalf("get after delete: %d, want 404", code)
	}
}
