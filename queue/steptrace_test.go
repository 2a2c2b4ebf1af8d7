package queue_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// TestStepTaskSpans: a traced step task that takes a lock, spawns
// children, waits for them and for a signal makes the spans of its steps,
// checkpoint writes, lock, spawn, waits and the signal's sending, each in
// the attempt it happened in, all in the submission's trace.
func TestStepTaskSpans(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns, queue.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	locker, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	steps := []task.Step{
		{Name: "fan-out", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
			l, err := locker.AcquireFenced(ctx, "report")
			if err != nil {
				return nil, err
			}
			_ = l.Release(ctx)
			return nil, task.Spawn([]task.Child{{Queue: "kids", Type: "k"}, {Queue: "kids", Type: "k"}}, task.SpawnOptions{})
		}},
		{Name: "ask", Run: func(context.Context, []byte) ([]byte, error) { return nil, task.WaitSignal("approve", 0) }},
		{Name: "finish", Run: func(context.Context, []byte) ([]byte, error) { return []byte(`"done"`), nil }},
	}
	if err := c.SetConfig(context.Background(), "kids", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	ctx, caller := tp.Tracer("test").Start(context.Background(), "caller")
	if _, err := c.Submit(ctx, "wf", []queue.Task{{ID: "p", Type: "agent", Metadata: queue.Metadata{Tenant: "acme"}}}, nil); err != nil {
		t.Fatal(err)
	}
	caller.End()
	parents := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", TracerProvider: tp})
	parents.HandleAll(queue.Steps(store, steps...))
	kids := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", TracerProvider: tp})
	kids.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, w := range []*queue.Worker{parents, kids} {
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(runCtx) }()
	}
	defer func() { cancel(); wg.Wait() }()
	waitUntil(t, "p to wait for its signal", func() bool {
		got, err := c.Get(context.Background(), "p")
		return err == nil && got.CurrentStatus == queue.Waiting && got.WaitingFor != nil && len(got.WaitingFor.Signals) > 0
	})
	sctx, sender := tp.Tracer("test").Start(context.Background(), "sender")
	if _, err := c.Signal(sctx, "p", "approve", nil, ""); err != nil {
		t.Fatal(err)
	}
	sender.End()
	if got := waitFinished(t, c, "p"); got.CurrentStatus != queue.Succeeded {
		t.Fatalf("parent %s (%s)", got.CurrentStatus, got.LastError)
	}
	cancel()
	wg.Wait()
	checkStepSpans(t, rec.Ended(), caller.SpanContext().TraceID().String())
	// The attempts' durations carry their trace as exemplar.
	srv := httptest.NewServer(metrics.Handler())
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	want := `trace_id="` + caller.SpanContext().TraceID().String() + `"`
	found := false
	for _, line := range strings.Split(string(body), "\n") {
		found = found || strings.HasPrefix(line, "drover_task_duration_seconds_bucket{") && strings.Contains(line, want)
	}
	if !found {
		t.Errorf("no drover_task_duration_seconds exemplar with %s", want)
	}
}

// checkStepSpans asserts the shape TestStepTaskSpans makes.
func checkStepSpans(t *testing.T, ended []sdktrace.ReadOnlySpan, traceID string) {
	t.Helper()
	byID := map[string]sdktrace.ReadOnlySpan{}
	named := map[string][]sdktrace.ReadOnlySpan{}
	for _, s := range ended {
		byID[s.SpanContext().SpanID().String()] = s
		named[s.Name()] = append(named[s.Name()], s)
	}
	parentName := func(s sdktrace.ReadOnlySpan) string {
		if p := byID[s.Parent().SpanID().String()]; p != nil {
			return p.Name()
		}
		return ""
	}
	for name, parent := range map[string]string{"step fan-out": "process wf", "step ask": "process wf", "step finish": "process wf",
		"lock acquire": "step fan-out", "spawn children": "process wf", "send kids": "spawn children",
		"await children": "process wf", "await signal": "process wf", "send signal": "sender"} {
		spans := named[name]
		if len(spans) == 0 {
			t.Errorf("no %q span", name)
			continue
		}
		for _, s := range spans {
			if got := parentName(s); got != parent {
				t.Errorf("%s: a child of %q, want %q", name, got, parent)
			}
			if name != "send signal" && s.SpanContext().TraceID().String() != traceID {
				t.Errorf("%s: in another trace", name)
			}
			if name != "send signal" && name != "send kids" && (attrOf(s, "drover.tenant") != "acme" || attrOf(s, "messaging.message.id") != "p") {
				t.Errorf("%s: attributes %v", name, s.Attributes())
			}
		}
	}
	if n := len(named["checkpoint"]); n != 3 {
		t.Errorf("%d checkpoint spans, want 3 (one a step)", n)
	}
	for _, s := range named["checkpoint"] {
		if p := parentName(s); len(p) < 5 || p[:5] != "step " {
			t.Errorf("checkpoint under %q, want a step", p)
		}
	}
	if s := named["await signal"]; len(s) == 1 && attrOf(s[0], "drover.signal.name") != "approve" {
		t.Errorf("await signal: %v", s[0].Attributes())
	}
	if s := named["await children"]; len(s) == 1 && s[0].EndTime().Sub(s[0].StartTime()) <= 0 {
		t.Errorf("await children lasts %v", s[0].EndTime().Sub(s[0].StartTime()))
	}
}
