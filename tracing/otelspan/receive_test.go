package otelspan

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestReceiveSpan: a claim's span is "receive <queue>", of kind client,
// with the messaging attributes of a batch receive, and links to the
// sampled creation contexts only, at most MaxReceiveLinks of them.
func TestReceiveSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	c := NewConsumer(Tracer(tp), "ns", "jobs", "w1")
	tps := make([]string, 300)
	for i := range tps {
		flags := "01"
		if i%2 == 1 {
			flags = "00" // sampled out: no link
		}
		tps[i] = fmt.Sprintf("00-%032x-%016x-%s", i+1, i+1, flags)
	}
	tps[0] = "" // untraced
	began := time.Now().Add(-time.Millisecond)
	c.Receive(context.Background(), began, 3, 3, func(i int) string { return tps[i] }, nil)
	c.Receive(context.Background(), began, 256, len(tps), func(i int) string { return tps[i] }, nil)
	c.Receive(context.Background(), began, 8, 0, nil, errors.New("etcd unavailable"))
	ended := rec.Ended()
	if len(ended) != 3 {
		t.Fatalf("%d spans, want 3", len(ended))
	}
	for i, want := range []struct {
		got, linked int
	}{{3, 1}, {300, MaxReceiveLinks}, {0, 0}} {
		s := ended[i]
		if s.Name() != "receive jobs" || s.SpanKind() != trace.SpanKindClient || !s.StartTime().Equal(began) {
			t.Errorf("span %d: %s, kind %v, start %v", i, s.Name(), s.SpanKind(), s.StartTime())
		}
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			attrs[string(kv.Key)] = kv.Value.String()
		}
		for k, v := range map[string]string{"messaging.system": "drover", "messaging.destination.name": "jobs",
			"messaging.operation.type": "receive", "messaging.operation.name": "receive", "drover.namespace": "ns",
			"messaging.client.id": "w1", "messaging.consumer.group.name": "jobs",
			"messaging.batch.message_count": fmt.Sprint(want.got), "drover.claim.linked": fmt.Sprint(want.linked)} {
			if attrs[k] != v {
				t.Errorf("span %d: %s=%q, want %q", i, k, attrs[k], v)
			}
		}
		if len(s.Links()) != want.linked {
			t.Errorf("span %d: %d links, want %d", i, len(s.Links()), want.linked)
		}
		for _, l := range s.Links() {
			if !l.SpanContext.IsSampled() {
				t.Errorf("span %d: a link to a context sampled out", i)
			}
		}
	}
	if got := ended[0].Links()[0].SpanContext.TraceID(); got != trace.TraceID([16]byte{15: 3}) {
		t.Errorf("link to %s, want the third task's", got)
	}
	if ended[2].Status().Description != "etcd unavailable" || len(ended[2].Events()) != 1 {
		t.Errorf("failed claim: status %+v, events %d", ended[2].Status(), len(ended[2].Events()))
	}
}

// TestReceiveOffAllocatesNothing: with tracing off, a worker's question
// and the call cost no allocation.
func TestReceiveOffAllocatesNothing(t *testing.T) {
	c := NewConsumer(Tracer(nil), "ns", "jobs", "w1")
	tp := func(int) string { return "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01" }
	began := time.Now()
	n := testing.AllocsPerRun(100, func() {
		if c.On() {
			t.Fatal("on with no provider set")
		}
		c.Receive(context.Background(), began, 64, 64, tp, nil)
	})
	if n != 0 {
		t.Errorf("%v allocations a claim, want 0", n)
	}
}
