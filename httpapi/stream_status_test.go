package httpapi_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestLateStreamLoggedAs503: a stream whose setup outlasts the request
// timeout answers 503, and its access log line and metrics say 503 too.
func TestLateStreamLoggedAs503(t *testing.T) {
	t.Parallel()
	var logs etcdtest.LogBuffer
	reg := prometheus.NewRegistry()
	a := newAPI(t, func(c *httpapi.Config) {
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
		c.Registerer = reg
		c.RequestTimeout = 100 * time.Millisecond
	})
	defer httpapi.SetBeforeStream(func(ctx context.Context) {
		if httpapi.NamespaceOf(ctx) == a.ns {
			select { // past the request's bound, as a slow setup would be
			case <-ctx.Done():
			case <-time.After(time.Minute):
			}
		}
	})()
	req, err := http.NewRequest("GET", a.base+"/v1/events", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	req.Header.Set("Accept", "text/event-stream")
	r, raw := answerWithin(t, req, time.Minute)
	if r.StatusCode != http.StatusServiceUnavailable || r.Header.Get("Retry-After") == "" {
		t.Fatalf("%d %s", r.StatusCode, raw)
	}
	if out := logs.String(); !strings.Contains(out, "route=/v1/events") || !strings.Contains(out, "status=503") {
		t.Fatalf("access log:\n%s", out)
	}
	want := `
# HELP drover_http_requests_total HTTP API requests, by route, method and status code.
# TYPE drover_http_requests_total counter
drover_http_requests_total{code="503",method="GET",route="/v1/events"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "drover_http_requests_total"); err != nil {
		t.Fatal(err)
	}
}
