package queue_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/tracing"
	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// attrOf is span s's attribute k, as a string ("" when absent).
func attrOf(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value.String()
		}
	}
	return ""
}

// TestTracedTaskIsOneTrace: a submission stores its span's context with
// the task; each attempt's span (the first fails, the second succeeds) is
// a child of it and links to it, the queue wait before the retry is
// recorded, and an exec handler gets its attempt's span as TRACEPARENT.
func TestTracedTaskIsOneTrace(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns, queue.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
	two := 2
	if _, err := c.Submit(ctx, "jobs", []queue.Task{{ID: "traced", Type: "x", MaxRetries: &two,
		BackoffBase: queue.Duration(time.Millisecond), Metadata: queue.Metadata{Tenant: "acme"}}}, nil); err != nil {
		t.Fatal(err)
	}
	caller.End()
	stored, err := c.Get(context.Background(), "traced")
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true, TracerProvider: tp})
	script := `[ "$DROVER_ATTEMPT" = 1 ] && { echo "first try fails" >&2; exit 3; }; printf %s "$TRACEPARENT"`
	w.HandleAll(queue.ExecHandler([]string{"sh", "-c", script}, 0, time.Second, nil))
	runDrain(t, w)
	done, err := c.Get(context.Background(), "traced")
	if err != nil || done.CurrentStatus != queue.Succeeded {
		t.Fatalf("task: %+v, %v", done, err)
	}

	var send sdktrace.ReadOnlySpan
	var attempts, waits []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch {
		case s.Name() == "send jobs":
			send = s
		case s.Name() == "process jobs":
			attempts = append(attempts, s)
		case s.Name() == "wait jobs":
			waits = append(waits, s)
		}
	}
	if send == nil || send.Parent().SpanID() != caller.SpanContext().SpanID() || send.SpanKind() != trace.SpanKindProducer {
		t.Fatalf("send span %v: want a producer child of the caller's", send)
	}
	if want := otelspan.Format(send.SpanContext()); stored.TraceParent != want {
		t.Fatalf("stored traceparent %q, want the send span's %q", stored.TraceParent, want)
	}
	for k, want := range map[attribute.Key]string{"messaging.system": "drover", "messaging.destination.name": "jobs",
		"messaging.operation.type": "send", "drover.namespace": ns} {
		if got := attrOf(send, k); got != want {
			t.Errorf("send %s = %q, want %q", k, got, want)
		}
	}
	if len(attempts) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(attempts))
	}
	for i, a := range attempts {
		n := i + 1
		if a.SpanContext().TraceID() != caller.SpanContext().TraceID() || a.Parent().SpanID() != send.SpanContext().SpanID() {
			t.Errorf("attempt %d: parent %v, want the send span %v", n, a.Parent(), send.SpanContext())
		}
		if len(a.Links()) != 1 || a.Links()[0].SpanContext.SpanID() != send.SpanContext().SpanID() {
			t.Errorf("attempt %d: links %v, want one to the send span", n, a.Links())
		}
		end := map[int]string{1: otelspan.EndRetry, 2: otelspan.EndSuccess}[n]
		for k, want := range map[attribute.Key]string{"drover.attempt.number": string(rune('0' + n)), "drover.attempt.end": end,
			"messaging.operation.type": "process", "messaging.message.id": "traced", "drover.tenant": "acme",
			"messaging.client.id": w.ID(), "drover.task.type": "x"} {
			if got := attrOf(a, k); got != want {
				t.Errorf("attempt %d: %s = %q, want %q", n, k, got, want)
			}
		}
		if a.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("attempt %d: kind %v, want consumer", n, a.SpanKind())
		}
	}
	if got, want := string(done.Result), otelspan.Format(attempts[1].SpanContext()); got != want {
		t.Fatalf("the exec handler's TRACEPARENT %q, want the attempt's %q", got, want)
	}
	// The failed attempt's status says how its command ended, without the
	// tail of its standard error, which no span carries.
	if got := attempts[0].Status().Description; got != "sh: exit status 3" {
		t.Errorf("the failed attempt's status %q, want %q", got, "sh: exit status 3")
	}
	for _, s := range rec.Ended() {
		for _, kv := range s.Attributes() {
			if strings.Contains(kv.Value.String(), "first try fails") {
				t.Errorf("span %s carries the stderr tail in %s", s.Name(), kv.Key)
			}
		}
		for _, ev := range s.Events() {
			for _, kv := range ev.Attributes {
				if strings.Contains(kv.Value.String(), "first try fails") {
					t.Errorf("span %s event %s carries the stderr tail in %s", s.Name(), ev.Name, kv.Key)
				}
			}
		}
	}
	kept := false
	for _, tr := range done.Transitions {
		kept = kept || tr.Status == queue.Retrying && tr.Error == "sh: exit status 3: first try fails"
	}
	if !kept {
		t.Errorf("the task lost its error's stderr tail: %+v", done.Transitions)
	}
	retryWait := false
	for _, s := range waits {
		if s.Parent().SpanID() != send.SpanContext().SpanID() {
			t.Errorf("wait span under %v, want the send span", s.Parent())
		}
		retryWait = retryWait || attrOf(s, "drover.wait.after") == string(queue.Retrying)
	}
	if !retryWait {
		for _, s := range waits {
			t.Logf("wait span %v", s.Attributes())
		}
		t.Fatalf("no wait span for the retry among %d", len(waits))
	}
}

// TestUntracedSubmissionStoresNoContext: without a span context (tracing
// off) nothing is stored; a malformed traceparent is refused by name.
func TestUntracedSubmissionStoresNoContext(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	res, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: "plain", Type: "x"}, {ID: "bad", Type: "x", TraceParent: "00-nope"}}, nil)
	if err != nil || res.Submitted != 1 || len(res.Rejected) != 1 || !strings.Contains(res.Rejected[0].Error, "traceparent") {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	got, err := c.Get(context.Background(), "plain")
	if err != nil || got.TraceParent != "" {
		t.Fatalf("stored %+v, %v: want no traceparent", got, err)
	}
	if _, err := c.Get(context.Background(), "bad"); !errors.Is(err, queue.ErrNotFound) {
		t.Fatalf("the refused task: %v", err)
	}
}

// TestUntracedTaskGetsNoInheritedTraceparent: the trace context the
// worker's own environment holds (TRACEPARENT, TRACESTATE, BAGGAGE) does
// not reach the exec handler of a task that was not traced.
func TestUntracedTaskGetsNoInheritedTraceparent(t *testing.T) {
	t.Setenv("TRACEPARENT", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	t.Setenv("TRACESTATE", "k=v")
	t.Setenv("BAGGAGE", "user=1")
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: "plain", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true})
	w.HandleAll(queue.ExecHandler([]string{"sh", "-c", `printf %s "[$TRACEPARENT|$TRACESTATE|$BAGGAGE]"`}, 0, time.Second, nil))
	runDrain(t, w)
	done, err := c.Get(context.Background(), "plain")
	if err != nil || done.CurrentStatus != queue.Succeeded || string(done.Result) != "[||]" {
		t.Fatalf("task %+v (%v): want it to see no trace context", done, err)
	}
}

// BenchmarkQueueTracing is BenchmarkQueue with tracing off, and on with
// 1 % and 100 % of the tasks' attempts sampled, exported over OTLP/HTTP to
// a receiver on loopback that discards them, through the batch span
// processor that tracing.Setup configures (tracing.BatchOptions). Each
// task traced carries a sampled traceparent of its own (as if submitted
// by a traced request); the sampler keeps the ratio of them by trace id.
// off-with-traceparent is tracing off for tasks that carry one (what
// storing it costs). spans/task counts what reached the exporter: a
// queue of spans that overflowed would drop some and look cheaper.
//
// The receiver runs in a process of its own (this test binary in its
// otlp-sink mode), as a collector does in production: what it spends
// reading the requests is not the benchmark's CPU (cpu-µs/task), though
// it shares the machine's cores.
func BenchmarkQueueTracing(b *testing.B) {
	sink := startSink(b)
	for _, tc := range []struct {
		name   string
		ratio  float64
		traced bool
	}{{"off", 0, false}, {"off-with-traceparent", 0, true}, {"sampled-1pct", 0.01, true}, {"sampled-100pct", 1, true}} {
		b.Run(tc.name, func(b *testing.B) {
			if tc.ratio == 0 { // the global provider: a no-op
				benchQueue(b, nil, tc.traced)
				return
			}
			exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink+"/v1/traces"))
			if err != nil {
				b.Fatal(err)
			}
			counted := &countingExporter{SpanExporter: exp}
			ratio := sdktrace.TraceIDRatioBased(tc.ratio)
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(counted, tracing.BatchOptions()...),
				sdktrace.WithSampler(sdktrace.ParentBased(ratio, sdktrace.WithRemoteParentSampled(ratio))))
			benchQueue(b, tp, true)
			if err := tp.Shutdown(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(counted.spans.Load())/float64(b.N), "spans/task")
		})
	}
}

// countingExporter counts the spans it exports.
type countingExporter struct {
	sdktrace.SpanExporter
	spans atomic.Int64
}

// ExportSpans counts spans and exports them.
func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	e.spans.Add(int64(len(spans)))
	return e.SpanExporter.ExportSpans(ctx, spans)
}

// startSink starts the OTLP receiver of BenchmarkQueueTracing in a
// process of its own and returns its URL; it ends with the benchmark.
func startSink(b testing.TB) string {
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), helperEnv+"=otlp-sink")
	in, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = in.Close(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		b.Fatalf("the receiver's address: %v", err)
	}
	return "http://" + strings.TrimSpace(line)
}

// runSinkHelper is an OTLP/HTTP receiver on loopback that reads each
// request and discards it (no decoding: it charges the benchmark nothing
// a collector would not spend elsewhere). It prints its address and
// serves until its standard input closes.
func runSinkHelper() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	s := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.Serve(ln) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = s.Close()
	return 0
}
