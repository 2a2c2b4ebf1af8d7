package otelspan_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/tracing/otelspan"
	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Scrape is what metrics.Handler serves to a scraper that asks for
// OpenMetrics, with extra's families after drover's own.
func scrape(t *testing.T, extra ...prometheus.Gatherer) string {
	t.Helper()
	srv := httptest.NewServer(metrics.Handler(extra...))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestObserveCarriesTheTraceAsExemplar: an observation made inside a
// sampled span carries its trace id in the OpenMetrics exposition; one
// made without a span, none.
func TestObserveCarriesTheTraceAsExemplar(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "test_latency_seconds", Help: "x", Buckets: []float64{1, 10}}, []string{"route"})
	reg.MustRegister(h)
	tp := sdktrace.NewTracerProvider()
	ctx, span := tp.Tracer("test").Start(context.Background(), "op")
	otelspan.Observe(ctx, h.WithLabelValues("traced"), 0.5)
	span.End()
	otelspan.Observe(context.Background(), h.WithLabelValues("plain"), 5)
	out := scrape(t, reg)
	// The exemplar's labels come in either order.
	bucket := `test_latency_seconds_bucket{route="traced",le="1.0"} 1 # {`
	tid, sid := `trace_id="`+span.SpanContext().TraceID().String()+`"`, `span_id="`+span.SpanContext().SpanID().String()+`"`
	found := false
	for _, line := range strings.Split(out, "\n") {
		found = found || strings.HasPrefix(line, bucket) && strings.Contains(line, tid) && strings.Contains(line, sid) && strings.Contains(line, "} 0.5 ")
	}
	if !found {
		t.Fatalf("no exemplar with %s and %s in\n%s", tid, sid, out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, `route="plain"`) && strings.Contains(line, "#") {
			t.Errorf("an exemplar without a span: %s", line)
		}
	}
}

// TestObserveOffAllocatesNothing: without a sampled span, Observe is the
// histogram's Observe.
func TestObserveOffAllocatesNothing(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "x", Help: "x"})
	ctx := context.Background()
	if n := testing.AllocsPerRun(100, func() { otelspan.Observe(ctx, h, 1) }); n != 0 {
		t.Errorf("%v allocations, want 0", n)
	}
}
