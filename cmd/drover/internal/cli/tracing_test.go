package cli_test

import (
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/tracing/otelspan"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// receivedSpan is a span an OTLP receiver got, with the service that sent it.
type receivedSpan struct {
	service string
	span    *tracepb.Span
}

func (s receivedSpan) id() string     { return hex.EncodeToString(s.span.SpanId) }
func (s receivedSpan) parent() string { return hex.EncodeToString(s.span.ParentSpanId) }
func (s receivedSpan) trace() string  { return hex.EncodeToString(s.span.TraceId) }

// attr is the span's attribute k as text ("" when absent).
func (s receivedSpan) attr(k string) string {
	for _, kv := range s.span.Attributes {
		if kv.Key != k {
			continue
		}
		switch v := kv.Value.Value.(type) {
		case *commonpb.AnyValue_StringValue:
			return v.StringValue
		case *commonpb.AnyValue_IntValue:
			return strconv.FormatInt(v.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			return strconv.FormatBool(v.BoolValue)
		}
	}
	return ""
}

// otlpReceiver is an OTLP/HTTP trace receiver on loopback, built on the
// OpenTelemetry proto packages: what a Collector would get.
type otlpReceiver struct {
	url   string
	mu    sync.Mutex
	spans []receivedSpan
}

func startReceiver(t *testing.T) *otlpReceiver {
	t.Helper()
	r := &otlpReceiver{}
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.NotFound(w, req)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = zr
		}
		raw, err := io.ReadAll(body)
		var in coltracepb.ExportTraceServiceRequest
		if err == nil && req.Header.Get("Content-Type") == "application/json" {
			err = unmarshalOTLPJSON(raw, &in)
		} else if err == nil {
			err = proto.Unmarshal(raw, &in)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&in)
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(s.Close)
	r.url = s.URL
	return r
}

// unmarshalOTLPJSON decodes OTLP/JSON, whose trace and span ids are hex
// where protojson expects base64.
func unmarshalOTLPJSON(raw []byte, in *coltracepb.ExportTraceServiceRequest) error {
	var doc any
	if err := json.Unmarshal(raw, &doc); err != nil {
		return err
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && (k == "traceId" || k == "spanId" || k == "parentSpanId") {
					if b, err := hex.DecodeString(s); err == nil {
						v[k] = base64.StdEncoding.EncodeToString(b)
					}
					continue
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
	b, err := json.Marshal(doc)
	if err != nil {
		return err
	}
	return protojson.Unmarshal(b, in)
}

func (r *otlpReceiver) add(in *coltracepb.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range in.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.Value.GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, sp := range ss.Spans {
				r.spans = append(r.spans, receivedSpan{service: service, span: sp})
			}
		}
	}
}

// find returns the spans that match.
func (r *otlpReceiver) find(match func(receivedSpan) bool) []receivedSpan {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []receivedSpan
	for _, s := range r.spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// pythonWorker runs one attempt of a task of queue in a Python worker
// process (the standard-library client, claiming over the HTTP API at
// url), exporting its span to the receiver at otlp: the handler asks the
// API for the queue's stats (a request under the attempt's span) and
// fails, so that the task is retried.
func pythonWorker(t *testing.T, url, queue, otlp string) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("no python3")
	}
	src, err := filepath.Abs(filepath.Join("..", "..", "..", "..", "clients", "python", "src"))
	if err != nil {
		t.Fatal(err)
	}
	script := `import sys, drover
c = drover.Client(sys.argv[1])
q = c.queue(sys.argv[2])
def handle(task):
    q.stats()
    raise RuntimeError("the python attempt fails")
stats = c.worker(sys.argv[2], ttl=5, wait=1, name="py-worker")(handle).run(max_tasks=1, duration=60, handle_signals=False)
sys.exit(0 if stats["failed"] == 1 else 1)
`
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "python3", "-c", script, url, queue)
	cmd.Env = cleanEnv("PYTHONPATH="+src, "OTEL_EXPORTER_OTLP_ENDPOINT="+otlp, "OTEL_SERVICE_NAME=python-worker")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("python worker: %v\n%s", err, out)
	}
}

// TestOneTraceFromSubmitterToRetry: a Go program submits a task over the
// HTTP API under a span of its own; a Python worker process claims it over
// the API and fails attempt 1; a drover worker process runs attempt 2 (an
// exec handler) and is SIGKILLed during it; a second worker process takes
// the task over and runs it to success. An OTLP receiver gets one trace:
// the submitter's span, its HTTP client span, the API's route span, the
// send span under it, and under the send span (and linked to it) the
// Python worker's attempt (with its handler's request under it: the
// Python client span, the route span under that), the lost attempt and
// the last one, whose exec handler saw the attempt's span as TRACEPARENT.
func TestOneTraceFromSubmitterToRetry(t *testing.T) {
	ns := etcdtest.Namespace(t)
	recv := startReceiver(t)
	provider := func(service string) *sdktrace.TracerProvider {
		exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(recv.url+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp),
			sdktrace.WithResource(resource.NewSchemaless(semconv.ServiceName(service))))
		t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
		return tp
	}

	// The HTTP API, in this process, traced by its own provider.
	api, err := httpapi.New(httpapi.Config{Etcd: srv.Client(t), Namespace: ns, Registerer: prometheus.NewRegistry(),
		TracerProvider: provider("drover-server")})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = api.Serve(l, "", "") }()
	t.Cleanup(func() { _ = api.Close(context.Background()) })

	// The submitter: a span of its own, and otelhttp on its client.
	subTP := provider("submitter")
	ctx, root := subTP.Tracer("submitter").Start(context.Background(), "summarize the inbox")
	client := &http.Client{Transport: otelhttp.NewTransport(http.DefaultTransport, otelhttp.WithTracerProvider(subTP),
		otelhttp.WithPropagators(propagation.TraceContext{}))}
	body := `[{"task_id":"traced","task_type":"summarize","max_retries":3,"backoff_base":"1ms","backoff_max":"2ms","metadata":{"tenant":"acme"}}]`
	apiURL := "http://" + l.Addr().String()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, apiURL+"/v1/queues/traced/tasks", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("submit: %d %s", resp.StatusCode, got)
	}
	root.End()
	traceID := root.SpanContext().TraceID().String()

	pythonWorker(t, apiURL, "traced", recv.url)

	// The first drover worker's attempt (2) writes its TRACEPARENT and its
	// pid, then hangs until the worker is SIGKILLed; the second's prints it.
	dir := t.TempDir()
	first, pidFile := filepath.Join(dir, "first"), filepath.Join(dir, "pid")
	script := `if [ "$DROVER_ATTEMPT" = 2 ]; then echo $$ > ` + pidFile + `; printf %s "$TRACEPARENT" > ` + first + `; exec sleep 60; fi; printf %s "$TRACEPARENT"`
	env := cleanEnv("OTEL_EXPORTER_OTLP_ENDPOINT="+recv.url, "OTEL_BSP_SCHEDULE_DELAY=50", "OTEL_TRACES_SAMPLER=parentbased_always_on")
	args := append(etcdFlags(ns), "worker", "--queue", "traced", "--ttl", "1s", "--backoff-base", "1ms", "--handler", "exec:sh -c '"+script+"'")
	w1 := start(t, env, args...)
	waitFor(t, 30*time.Second, "the first attempt", func() bool { b, _ := os.ReadFile(first); return len(b) == otelspan.TraceParentLen })
	if err := w1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	w1.wait(t, 10*time.Second)
	if b, _ := os.ReadFile(pidFile); len(b) > 0 {
		if pid, _ := strconv.Atoi(strings.TrimSpace(string(b))); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL) // the orphaned handler
		}
	}
	w2 := start(t, env, append(args, "--drain")...)
	if code := w2.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("second worker: exit %d: %s", code, w2.stderr.String())
	}

	r := drover(t, append(etcdFlags(ns), "tasks", "get", "traced", "--json")...)
	var task struct {
		Status      string `json:"current_status"`
		Result      string `json:"result"`
		TraceParent string `json:"traceparent"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &task); err != nil || task.Status != "SUCCEEDED" {
		t.Fatalf("task get: %v %q %s", err, r.stdout, r.stderr)
	}

	one := func(what string, match func(receivedSpan) bool) receivedSpan {
		t.Helper()
		var found []receivedSpan
		waitFor(t, 10*time.Second, what, func() bool { found = recv.find(match); return len(found) > 0 })
		if len(found) != 1 {
			t.Fatalf("%d spans for %s, want 1", len(found), what)
		}
		if found[0].trace() != traceID {
			t.Fatalf("%s is in trace %s, want %s", what, found[0].trace(), traceID)
		}
		return found[0]
	}
	clientSpan := one("the submitter's HTTP span", func(s receivedSpan) bool {
		return s.service == "submitter" && s.span.Kind == tracepb.Span_SPAN_KIND_CLIENT
	})
	if clientSpan.parent() != root.SpanContext().SpanID().String() {
		t.Fatalf("client span under %s, want the submitter's root", clientSpan.parent())
	}
	route := one("the API's route span", func(s receivedSpan) bool {
		return s.service == "drover-server" && s.span.Name == "POST /v1/queues/{queue}/tasks"
	})
	if route.parent() != clientSpan.id() || route.attr("http.route") != "/v1/queues/{queue}/tasks" {
		t.Fatalf("route span under %s (route %q), want the client span %s", route.parent(), route.attr("http.route"), clientSpan.id())
	}
	send := one("the send span", func(s receivedSpan) bool { return s.span.Name == "send traced" })
	if send.service != "drover-server" || send.parent() != route.id() || send.span.Kind != tracepb.Span_SPAN_KIND_PRODUCER {
		t.Fatalf("send span of %s under %s kind %v, want the server's producer under the route", send.service, send.parent(), send.span.Kind)
	}
	if want := "00-" + traceID + "-" + send.id() + "-01"; task.TraceParent != want {
		t.Fatalf("stored traceparent %q, want %q", task.TraceParent, want)
	}
	attempt := func(n int) receivedSpan {
		return one("attempt "+strconv.Itoa(n), func(s receivedSpan) bool {
			return s.span.Name == "process traced" && s.attr("drover.attempt.number") == strconv.Itoa(n)
		})
	}
	py, lost, second := attempt(1), attempt(2), attempt(3)
	if py.service != "python-worker" || py.parent() != send.id() || py.span.Kind != tracepb.Span_SPAN_KIND_CONSUMER ||
		len(py.span.Links) != 1 || hex.EncodeToString(py.span.Links[0].SpanId) != send.id() {
		t.Fatalf("python attempt of %s under %s kind %v links %v, want a consumer under the send span, linked to it", py.service, py.parent(), py.span.Kind, py.span.Links)
	}
	if py.attr("drover.attempt.end") != "retry" || py.attr("messaging.client.id") != "py-worker" || py.attr("drover.tenant") != "acme" {
		t.Fatalf("python attempt: attributes %v", py.span.Attributes)
	}
	stats := one("the python handler's request", func(s receivedSpan) bool {
		return s.service == "drover-server" && s.span.Name == "GET /v1/queues/{queue}/stats"
	})
	pyGet := one("the python handler's client span", func(s receivedSpan) bool {
		return s.service == "python-worker" && s.span.Kind == tracepb.Span_SPAN_KIND_CLIENT
	})
	if pyGet.parent() != py.id() || pyGet.span.Name != "GET" || !strings.HasSuffix(pyGet.attr("url.full"), "/stats") {
		t.Fatalf("the python handler's client span %q (%s) under %s, want a GET of the stats under its attempt %s", pyGet.span.Name, pyGet.attr("url.full"), pyGet.parent(), py.id())
	}
	if stats.parent() != pyGet.id() {
		t.Fatalf("the python handler's request under %s, want its client span %s", stats.parent(), pyGet.id())
	}
	for _, a := range []receivedSpan{lost, second} {
		if a.service != "drover-worker" || a.parent() != send.id() || a.span.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
			t.Fatalf("attempt span of %s under %s kind %v, want a worker's consumer under the send span", a.service, a.parent(), a.span.Kind)
		}
		if a.attr("messaging.system") != "drover" || a.attr("messaging.destination.name") != "traced" ||
			a.attr("messaging.operation.type") != "process" || a.attr("messaging.message.id") != "traced" || a.attr("drover.tenant") != "acme" {
			t.Fatalf("attempt %s: messaging attributes %v", a.attr("drover.attempt.number"), a.span.Attributes)
		}
	}
	if lost.attr("drover.attempt.end") != "lost" || lost.attr("drover.attempt.reconstructed") != "true" {
		t.Fatalf("first attempt: end %q reconstructed %q, want a lost one recorded by its successor", lost.attr("drover.attempt.end"), lost.attr("drover.attempt.reconstructed"))
	}
	if second.attr("drover.attempt.end") != "success" || second.attr("drover.attempt.takeover") != "true" {
		t.Fatalf("second attempt: end %q takeover %q", second.attr("drover.attempt.end"), second.attr("drover.attempt.takeover"))
	}
	if len(second.span.Links) != 1 || hex.EncodeToString(second.span.Links[0].SpanId) != send.id() {
		t.Fatalf("second attempt links %v, want one to the send span", second.span.Links)
	}
	if want := "00-" + traceID + "-" + second.id() + "-01"; task.Result != want {
		t.Fatalf("the second attempt's TRACEPARENT %q, want its span %q", task.Result, want)
	}
	firstTP, _ := os.ReadFile(first)
	if sc, ok := otelspan.Parse(string(firstTP)); !ok || sc.TraceID().String() != traceID {
		t.Fatalf("the killed attempt's TRACEPARENT %q is not in trace %s", firstTP, traceID)
	}
}
