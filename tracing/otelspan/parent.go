package otelspan

import (
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// ParentBased returns tp marked as a provider whose sampler follows a
// remote parent's decision, as OpenTelemetry's parentbased_* samplers do
// (a span under a remote parent that was not sampled is never
// recorded): tracing.Setup marks the provider it builds so when
// OTEL_TRACES_SAMPLER is unset or parentbased_*. An attempt of a task
// whose stored traceparent was not sampled then starts no span in the
// SDK at all (the SDK would only start one to drop it): it costs what
// tracing off costs a task that carries a traceparent, and its handler
// gets the task's own creation context as TRACEPARENT (not sampled, as
// the dropped span's would be). Mark only a provider whose sampler does
// follow its parent: with another (always_on, traceidratio) such an
// attempt would go unrecorded where the sampler would have kept it.
// It returns nil and the no-op provider as they are: they record
// nothing, and On tells their tracers apart only unmarked.
func ParentBased(tp trace.TracerProvider) trace.TracerProvider {
	switch tp.(type) {
	case nil, parentBased, noop.TracerProvider:
		return tp
	}
	return parentBased{tp}
}

// parentBased is a provider ParentBased marked.
type parentBased struct{ trace.TracerProvider }

// Tracer is the provider's tracer, marked.
func (p parentBased) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return parentTracer{p.TracerProvider.Tracer(name, opts...)}
}

// parentTracer is the tracer of a provider ParentBased marked.
type parentTracer struct{ trace.Tracer }

// parentDecides reports whether tr's provider was marked by ParentBased.
func parentDecides(tr trace.Tracer) bool {
	if g, ok := tr.(globalTracer); ok {
		tr = g.Tracer
	}
	_, ok := tr.(parentTracer)
	return ok
}
