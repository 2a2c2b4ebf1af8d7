package otelspan

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"
)

// Observe records v in histogram h and, when ctx holds a sampled span,
// that span's trace id and span id as the observation's exemplar
// (trace_id, span_id: the labels Grafana and Prometheus look for), so
// that a slow bucket leads to a trace of it. Without a sampled span it
// is h.Observe(v): no allocation.
func Observe(ctx context.Context, h prometheus.Observer, v float64) {
	sc := trace.SpanContextFromContext(ctx)
	if eo, ok := h.(prometheus.ExemplarObserver); ok && sc.IsSampled() {
		eo.ObserveWithExemplar(v, prometheus.Labels{"trace_id": sc.TraceID().String(), "span_id": sc.SpanID().String()})
		return
	}
	h.Observe(v)
}
