package queue_test

import (
	"context"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// TestClaimSpan: a worker's claim call that takes tasks is a "receive
// <queue>" span of kind client, with the batch's count, linked to the
// creation contexts of the claimed tasks that were sampled, and not to
// those sampled out or absent.
func TestClaimSpan(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	sampled := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	out := "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	if _, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: "a", Type: "x", TraceParent: sampled},
		{ID: "b", Type: "x", TraceParent: out}, {ID: "c", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true, TracerProvider: tp})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	runDrain(t, w)
	got, links := int64(0), 0
	var receives []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() != "receive jobs" {
			continue
		}
		receives = append(receives, s)
		if s.SpanKind() != trace.SpanKindClient || s.Parent().IsValid() {
			t.Errorf("receive span: kind %v, parent %v", s.SpanKind(), s.Parent())
		}
		for k, v := range map[attribute.Key]string{"messaging.operation.type": "receive", "messaging.system": "drover",
			"messaging.destination.name": "jobs", "messaging.consumer.group.name": "jobs", "drover.namespace": ns} {
			if a := attrOf(s, k); a != v {
				t.Errorf("receive span: %s=%q, want %q", k, a, v)
			}
		}
		if attrOf(s, "messaging.client.id") == "" {
			t.Error("receive span: no messaging.client.id")
		}
		for _, kv := range s.Attributes() {
			if kv.Key == "messaging.batch.message_count" {
				got += kv.Value.AsInt64()
			}
		}
		for _, l := range s.Links() {
			links++
			if l.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
				t.Errorf("receive span links to %s", l.SpanContext.TraceID())
			}
		}
	}
	if len(receives) == 0 || got != 3 || links != 1 {
		t.Errorf("%d receive spans, %d tasks received, %d links; want 3 tasks, 1 link", len(receives), got, links)
	}
}
