package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// sawParent is a handler that records whether its request's context
// holds a span context (the caller's traceparent, extracted).
type sawParent struct{ valid bool }

func (s *sawParent) ServeHTTP(_ http.ResponseWriter, r *http.Request) {
	s.valid = trace.SpanContextFromContext(r.Context()).IsValid()
}

// TestUntracedRequestsCostNothing: while the server does not trace (a
// no-op provider, or no global one), a request reaches its handler with
// no allocation and without its traceparent header read, so that no
// trace context is stored a worker of an older build could not read.
func TestUntracedRequestsCostNothing(t *testing.T) {
	r := httptest.NewRequest("POST", "/v1/queues/q/tasks", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	w := httptest.NewRecorder()
	for name, tp := range map[string]trace.TracerProvider{"no-op": noop.NewTracerProvider(), "global unset": nil} {
		h := &sawParent{}
		served := traced(h, tp)
		if allocs := testing.AllocsPerRun(100, func() { served.ServeHTTP(w, r) }); allocs != 0 {
			t.Errorf("%s provider: %v allocations per request, want 0", name, allocs)
		}
		if h.valid {
			t.Errorf("%s provider: the handler got the caller's traceparent", name)
		}
	}
}

// BenchmarkUntracedRequest is what tracing adds to a request while it is
// off (a no-op provider), and what otelhttp with that provider added
// before the server skipped it: run with -benchmem.
func BenchmarkUntracedRequest(b *testing.B) {
	r := httptest.NewRequest("POST", "/v1/queues/q/tasks", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	w := httptest.NewRecorder()
	for name, served := range map[string]http.Handler{
		"skipped": traced(&sawParent{}, noop.NewTracerProvider()),
		"otelhttp-noop": otelhttp.NewHandler(&sawParent{}, "drover", otelhttp.WithTracerProvider(noop.NewTracerProvider()),
			otelhttp.WithPropagators(propagation.TraceContext{}), otelhttp.WithMeterProvider(metricnoop.NewMeterProvider())),
	} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				served.ServeHTTP(w, r)
			}
		})
	}
}
