// Package tracing sets up OpenTelemetry tracing for drover's processes and
// carries a task's trace context from its submission to its attempts.
//
// Setup configures the OpenTelemetry SDK the standard way, from the
// OTEL_* environment variables, and does nothing unless they ask for
// traces: OTEL_TRACES_EXPORTER=otlp, or an OTLP endpoint
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
// When they do, it installs the global TracerProvider and the W3C trace
// context propagator, which the instrumented packages (queue, httpapi)
// use unless given a TracerProvider of their own:
//
//	p, err := tracing.Setup(ctx, "drover-worker")
//	if err != nil { ... }
//	defer p.Shutdown(context.Background()) // flushes the spans left
//
// A library user who configures OpenTelemetry already does not call Setup:
// queue.WorkerConfig.TracerProvider and queue.WithTracerProvider take the
// provider, as every instrumented Go library does; without one they use
// the global provider, a no-op until someone sets it.
//
// The trace context travels with a task as a W3C traceparent string
// (TraceParent, Remote): 55 bytes, stored only when the submitter's
// context holds a valid span context.
package tracing
