package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/tracing/otelspan"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestClaimStoppedMakesNoSpan: a claim call cut short by the worker's
// stop is no failure (the loop neither logs nor retries it) and makes
// no "receive" span with an error; a claim that fails while the worker
// runs still makes one.
func TestClaimStoppedMakesNoSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	w := &Worker{spans: otelspan.NewConsumer(otelspan.Tracer(tp), "ns", "jobs", "w1")}
	stop, cancel := context.WithCancel(context.Background())
	cancel()
	w.claimed(stop, context.Background(), time.Now(), 8, nil, fmt.Errorf("queue: claim: %w", context.Canceled))
	w.claimed(context.Background(), context.Background(), time.Now(), 8, nil, errors.New("etcd unavailable"))
	ended := rec.Ended()
	if len(ended) != 1 || ended[0].Status().Description != "etcd unavailable" {
		for _, s := range ended {
			t.Logf("span %s: status %+v", s.Name(), s.Status())
		}
		t.Fatalf("%d receive spans, want 1: the failure while running only", len(ended))
	}
}
