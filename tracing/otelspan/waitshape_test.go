package otelspan

import (
	"context"
	"testing"
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestWaitShapes: WaitSpanLean's wait span carries the task's id and the
// wait's own attributes only; WaitFolded records a first attempt's plain
// wait on the attempt's span (drover.wait.start and a "queued" event at
// that time) and a retry's wait as a span still.
func TestWaitShapes(t *testing.T) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	claimed := time.Now()
	ready := claimed.Add(-time.Second)
	for _, tc := range []struct {
		shape WaitShape
		a     Attempt
		waits int
		keys  []string
	}{
		{WaitSpan, Attempt{TaskID: "t1", TaskType: "x", Number: 1}, 1,
			[]string{"messaging.system", "messaging.destination.name", "drover.namespace", "messaging.message.id", "drover.task.type", "drover.attempt.number", "drover.wait.deferrals"}},
		{WaitSpanLean, Attempt{TaskID: "t1", TaskType: "x", Number: 2, WaitAfter: "RETRYING"}, 1,
			[]string{"messaging.message.id", "drover.attempt.number", "drover.wait.deferrals", "drover.wait.after"}},
		{WaitFolded, Attempt{TaskID: "t1", TaskType: "x", Number: 1}, 0, nil},
		{WaitFolded, Attempt{TaskID: "t1", TaskType: "x", Number: 1, Deferrals: 1, WaitAfter: "PENDING", WaitReason: "deferred: rate limit"}, 1,
			[]string{"messaging.system", "messaging.destination.name", "drover.namespace", "messaging.message.id", "drover.task.type", "drover.attempt.number", "drover.wait.deferrals", "drover.wait.after", "drover.wait.reason"}},
	} {
		rec := tracetest.NewSpanRecorder()
		c := NewConsumer(Tracer(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))), "ns", "jobs", "w1")
		c.SetWaitShape(tc.shape)
		ctx, parent, span := c.Start(context.Background(), tp, claimed)
		a := tc.a
		a.Ready, a.Claimed = ready, claimed
		c.Describe(ctx, parent, span, &a)
		EndProcess(span, EndSuccess, nil)
		var waits []sdktrace.ReadOnlySpan
		var process sdktrace.ReadOnlySpan
		for _, s := range rec.Ended() {
			switch s.Name() {
			case "wait jobs":
				waits = append(waits, s)
			case "process jobs":
				process = s
			}
		}
		if len(waits) != tc.waits {
			t.Fatalf("shape %d: %d wait spans, want %d", tc.shape, len(waits), tc.waits)
		}
		var start int64
		for _, kv := range process.Attributes() {
			if kv.Key == AttrWaitStart {
				start = kv.Value.AsInt64()
			}
		}
		if folded := tc.waits == 0; folded != (start == ready.UnixNano()) || folded != (len(process.Events()) == 1) {
			t.Errorf("shape %d: drover.wait.start %d, %d events, want it folded: %t", tc.shape, start, len(process.Events()), folded)
		}
		if tc.waits == 0 {
			if ev := process.Events()[0]; ev.Name != "queued" || !ev.Time.Equal(ready) {
				t.Errorf("folded: event %s at %v, want queued at %v", ev.Name, ev.Time, ready)
			}
			continue
		}
		var keys []string
		for _, kv := range waits[0].Attributes() {
			keys = append(keys, string(kv.Key))
		}
		if len(keys) != len(tc.keys) {
			t.Errorf("shape %d: wait attributes %v, want %v", tc.shape, keys, tc.keys)
			continue
		}
		for i := range keys {
			if keys[i] != tc.keys[i] {
				t.Errorf("shape %d: wait attributes %v, want %v", tc.shape, keys, tc.keys)
				break
			}
		}
	}
}
