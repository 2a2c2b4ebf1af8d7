package tracing

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel"
)

// TestSetupMarksParentBasedSamplers: Setup marks its provider
// otelspan.ParentBased exactly when the SDK's sampler follows a remote
// parent (OTEL_TRACES_SAMPLER unset, or parentbased_* in any case, as
// the SDK reads it), so that an attempt under a creation context not
// sampled starts no span there, and is recorded under always_on and
// traceidratio, which keep it; a task with no traceparent is a root
// their sampler decides on either way.
func TestSetupMarksParentBasedSamplers(t *testing.T) {
	prev := otel.GetTracerProvider()
	defer otel.SetTracerProvider(prev)
	t.Setenv("OTEL_TRACES_EXPORTER", "otlp")
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1") // nothing is exported: no span ends
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "")
	out := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	for _, tc := range []struct {
		sampler        string
		marked, record bool // the attempt under out: no span at all; a span that records
	}{
		{"", true, false},
		{"parentbased_always_on", true, false},
		{"parentbased_traceidratio", true, false},
		{" ParentBased_Always_On ", true, false},
		{"always_on", false, true},
		{"traceidratio", false, true},
	} {
		t.Setenv("OTEL_TRACES_SAMPLER", tc.sampler)
		p, err := Setup(context.Background(), "drover-test")
		if err != nil {
			t.Fatal(err)
		}
		c := otelspan.NewConsumer(otelspan.Tracer(p.TracerProvider()), "ns", "jobs", "w1")
		ctx, _, span := c.Start(context.Background(), out, time.Now())
		if marked := otelspan.TraceParent(ctx) == out; marked != tc.marked || span.IsRecording() != tc.record {
			t.Errorf("sampler %q: marked %t, recording %t; want %t, %t", tc.sampler, marked, span.IsRecording(), tc.marked, tc.record)
		}
		if _, _, root := c.Start(context.Background(), "", time.Now()); !root.IsRecording() {
			t.Errorf("sampler %q: an untraced task's attempt not recorded", tc.sampler)
		}
		if err := p.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
