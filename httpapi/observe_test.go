package httpapi_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestRequestMetricsAndLogs: each request is counted by route template,
// method and code, timed, and logged once with its route and status, and
// never with the bearer token.
func TestRequestMetricsAndLogs(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	var logs etcdtest.LogBuffer
	a := newAPI(t, func(c *httpapi.Config) {
		c.Registerer = reg
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	sid := a.session(10)
	a.do("POST", "/v1/locks/m1", map[string]any{"session": sid}).want(t, 200)
	a.do("POST", "/v1/locks/m2", map[string]any{"session": sid}).want(t, 200)
	a.do("POST", "/v1/locks/m1", map[string]any{"session": sid}).problem(t, 409)
	want := `
# HELP drover_http_requests_total HTTP API requests, by route, method and status code.
# TYPE drover_http_requests_total counter
drover_http_requests_total{code="200",method="POST",route="/v1/locks/{name}"} 2
drover_http_requests_total{code="201",method="POST",route="/v1/sessions"} 1
drover_http_requests_total{code="409",method="POST",route="/v1/locks/{name}"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "drover_http_requests_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "drover_http_request_duration_seconds"); n != 2 {
		t.Fatalf("latency series: %d, want 2 (two routes)", n)
	}
	out := logs.String()
	if strings.Count(out, "http request") != 4 || !strings.Contains(out, "route=/v1/locks/{name}") || !strings.Contains(out, "status=409") {
		t.Fatalf("access log:\n%s", out)
	}
}
