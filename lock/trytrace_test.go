package lock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestTryAcquireSpan: inside a span that records, a TryAcquire is a
// "lock acquire" span that did not wait, with the token it got, or marked
// held, without an error (a held lock is an answer); outside one it makes
// none.
func TestTryAcquireSpan(t *testing.T) {
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	a, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 10e9, HolderID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(ctx)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	sctx, parent := tp.Tracer("test").Start(ctx, "attempt")
	l, err := a.TryAcquire(sctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.TryAcquire(sctx, "job"); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("second try: %v, want ErrHeld", err)
	}
	if _, err := a.TryAcquire(ctx, "other"); err != nil { // no span around it
		t.Fatal(err)
	}
	parent.End()
	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "lock acquire" {
			spans = append(spans, s)
		}
	}
	if len(spans) != 2 {
		t.Fatalf("%d lock spans, want 2", len(spans))
	}
	attrs := func(s sdktrace.ReadOnlySpan) map[string]string {
		m := map[string]string{}
		for _, kv := range s.Attributes() {
			m[string(kv.Key)] = kv.Value.String()
		}
		return m
	}
	took, held := attrs(spans[0]), attrs(spans[1])
	if took["drover.lock.name"] != "job" || took["drover.lock.waited"] != "false" || took["drover.lock.token"] == "" {
		t.Errorf("taken: %v (token %d)", took, l.Token())
	}
	if spans[0].Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Error("taken: not a child of the caller's span")
	}
	if held["drover.lock.token"] != "" || held["drover.lock.held"] != "true" || spans[1].Status().Code == codes.Error {
		t.Errorf("held: %v, status %+v", held, spans[1].Status())
	}
}
