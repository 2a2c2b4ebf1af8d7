package otelspan

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkProcessSpanOff is what an attempt pays for its span with
// tracing off (the global provider, a no-op): with and without a stored
// traceparent.
func BenchmarkProcessSpanOff(b *testing.B) {
	c := NewConsumer(Tracer(nil), "ns", "jobs", "w")
	now := time.Now()
	for _, tc := range []struct{ name, tp string }{{"untraced", ""}, {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				_, _, span := c.Start(context.Background(), tc.tp, now)
				EndProcess(span, EndSuccess, nil)
			}
		})
	}
}

// BenchmarkProcessSpanSampled is what an attempt pays for its span with
// the SDK sampling 1 % and 100 % of traces (spans dropped at the end, no
// export): a worker's Consumer, with the wait span and the context of the
// spans inside the attempt.
func BenchmarkProcessSpanSampled(b *testing.B) {
	now := time.Now()
	for _, tc := range []struct {
		name  string
		ratio float64
	}{{"1pct", 0.01}, {"100pct", 1}} {
		b.Run(tc.name, func(b *testing.B) {
			ratio := sdktrace.TraceIDRatioBased(tc.ratio)
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(ratio, sdktrace.WithRemoteParentSampled(ratio))))
			c := NewConsumer(Tracer(tp), "ns", "jobs", "w")
			tps := make([]string, 1024)
			for i := range tps {
				tps[i] = fmt.Sprintf("00-%016x%016x-%016x-01", rand.Uint64()|1, rand.Uint64(), rand.Uint64()|1)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				ctx, parent, span := c.Start(context.Background(), tps[i%len(tps)], now)
				if span.IsRecording() {
					_ = c.Describe(ctx, parent, span, &Attempt{TaskID: "t", TaskType: "x", Number: 1, Ready: now.Add(-time.Second), Claimed: now})
				}
				EndProcess(span, EndSuccess, nil)
				i++
			}
		})
	}
}
