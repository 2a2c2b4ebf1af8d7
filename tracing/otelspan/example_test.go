package otelspan_test

import (
	"context"
	"fmt"

	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel/trace"
)

// A task's trace context travels as a W3C traceparent: TraceParent reads
// it from a context, Remote puts it back as the remote parent of the
// spans started under it, and Env hands it to a command.
func ExampleTraceParent() {
	sc, _ := otelspan.Parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	stored := otelspan.TraceParent(ctx) // what Submit stores with a task
	fmt.Println(stored)
	attempt := otelspan.Remote(context.Background(), stored)
	fmt.Println(otelspan.Env(attempt))
	fmt.Printf("%q\n", otelspan.TraceParent(context.Background()))
	// Output:
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// [TRACEPARENT=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01]
	// ""
}
