package httpapi_test

import (
	"context"
	"strings"
	"testing"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/queue"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestSubmissionKeepsTheCallersTraceparent: a submission stores the
// request's traceparent header with its tasks; a task's own traceparent
// wins, and a malformed one is refused naming the field. GET and an HTTP
// worker's claim show it. (The server traces: one that does not
// ignores the header, see
// TestUntracedServerStoresOnlyExplicitTraceparents.)
func TestSubmissionKeepsTheCallersTraceparent(t *testing.T) {
	t.Parallel()
	tp := sdktrace.NewTracerProvider()
	a := newAPI(t, func(c *httpapi.Config) { c.TracerProvider = tp })
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	a.do("POST", "/v1/queues/traced/tasks", `[{"task_id":"h","task_type":"x"},{"task_id":"o","task_type":"x","traceparent":"`+own+`"}]`,
		"traceparent: "+header).want(t, 200)
	r := a.do("POST", "/v1/queues/traced/tasks", `[{"task_id":"bad","task_type":"x","traceparent":"00-zz"}]`).problem(t, 400)
	if !strings.Contains(string(r.Raw), "traceparent") {
		t.Fatalf("the problem does not name traceparent: %s", r.Raw)
	}
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	wants := map[string]string{"o": own}
	if got, err := c.Get(context.Background(), "h"); err != nil || !strings.HasPrefix(got.TraceParent, header[:36]) || len(got.TraceParent) != len(header) {
		t.Fatalf("task h: traceparent %q (%v), want one in the header's trace %q", got.TraceParent, err, header)
	} else {
		wants["h"] = got.TraceParent // the server's span, under the header's
	}
	for id, want := range wants {
		got, err := c.Get(context.Background(), id)
		if err != nil || got.TraceParent != want {
			t.Fatalf("task %s: traceparent %q (%v), want %q", id, got.TraceParent, err, want)
		}
		if shown := a.do("GET", "/v1/queues/traced/tasks/"+id, nil).want(t, 200).JSON["traceparent"]; shown != want {
			t.Fatalf("GET task %s shows traceparent %v, want %q", id, shown, want)
		}
	}
	// A worker over HTTP gets it with its claim, to continue the trace.
	claim := a.do("POST", "/v1/queues/traced/claim", map[string]any{"session": a.session(30), "max": 2}).want(t, 200)
	tasks, _ := claim.JSON["tasks"].([]any)
	if len(tasks) != 2 {
		t.Fatalf("claim: %s", claim.Raw)
	}
	for _, tk := range tasks {
		m := tk.(map[string]any)
		if want := wants[m["task_id"].(string)]; m["traceparent"] != want {
			t.Fatalf("claimed %v with traceparent %v, want %q", m["task_id"], m["traceparent"], want)
		}
	}
}

// TestUntracedServerStoresOnlyExplicitTraceparents: a server that does
// not trace (no provider: the global no-op) ignores the traceparent
// header, so that it stores nothing a worker of an older build could not
// read; a task's own traceparent field, which its caller asked for, is
// stored.
func TestUntracedServerStoresOnlyExplicitTraceparents(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const own = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	a.do("POST", "/v1/queues/untraced/tasks", `[{"task_id":"h","task_type":"x"},{"task_id":"o","task_type":"x","traceparent":"`+own+`"}]`,
		"traceparent: "+header).want(t, 200)
	for id, want := range map[string]string{"h": "", "o": own} {
		if shown, _ := a.do("GET", "/v1/queues/untraced/tasks/"+id, nil).want(t, 200).JSON["traceparent"].(string); shown != want {
			t.Fatalf("task %s stored traceparent %q, want %q", id, shown, want)
		}
	}
}

// TestRoutesAreServerSpans: with a provider, each route is a server span
// named after its route, under the request's traceparent, and the send
// span of a submission is its child; the health checks make none.
func TestRoutesAreServerSpans(t *testing.T) {
	t.Parallel()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	a := newAPI(t, func(c *httpapi.Config) { c.TracerProvider = tp })
	const header = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	a.do("POST", "/v1/queues/traced/tasks", `[{"task_id":"h","task_type":"x"}]`, "traceparent: "+header).want(t, 200)
	a.do("GET", "/healthz", nil).want(t, 200)
	var route, send sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "POST /v1/queues/{queue}/tasks":
			route = s
		case "send traced":
			send = s
		default:
			if strings.Contains(s.Name(), "health") {
				t.Errorf("a span for the health check: %s", s.Name())
			}
		}
	}
	if route == nil || route.Parent().SpanID().String() != "00f067aa0ba902b7" || route.SpanContext().TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" {
		t.Fatalf("route span %v: want one under the request's traceparent", route)
	}
	if send == nil || send.Parent().SpanID() != route.SpanContext().SpanID() {
		t.Fatalf("send span %v: want one under the route's", send)
	}
	if n := len(rec.Ended()); n != 2 {
		for _, s := range rec.Ended() {
			t.Logf("span %q", s.Name())
		}
		t.Fatalf("%d spans, want the route's and the send span", n)
	}
}
