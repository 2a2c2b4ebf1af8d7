package otelspan

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkExportFloor is the CPU an exported attempt costs in the
// OpenTelemetry SDK and its OTLP/HTTP exporter, sampled at 100 %, through
// a batch processor of drover's sizes that blocks rather than drops (so
// that every span is counted) to a receiver on loopback that discards
// what it reads (in this process: its reading is counted too, about 1 %
// of the whole). cpu-µs/attempt is the process's CPU time per attempt,
// the export of the last batch included. Shapes:
//
//   - sdk-2spans: the SDK alone, two spans an attempt (process and wait)
//     with the attributes drover sets, made with the SDK's own calls: the
//     floor of drover's current shape.
//   - sdk-1span: the same with one span an attempt (the process span).
//   - full, lean, fold: through a worker's Consumer (Start, Describe,
//     EndProcess) with the wait as WaitSpan, WaitSpanLean and WaitFolded
//     record it; a first attempt's plain wait, as most attempts' are.
//   - off-tp: tracing off, a task that carries a traceparent.
//   - 1pct: full, sampling 1 % of the attempts by trace id at the
//     worker (every task's traceparent sampled), as BenchmarkQueueTracing
//     does: 99 attempts in 100 start a span the SDK drops.
//   - 1pct-parent: full, 1 % of the tasks' traceparents sampled (the
//     submission decided) and the provider marked ParentBased.
func BenchmarkExportFloor(b *testing.B) {
	sink := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer sink.Close()
	tps := make([]string, 4096)
	for i := range tps {
		tps[i] = fmt.Sprintf("00-%016x%016x-%016x-01", rand.Uint64()|1, rand.Uint64(), rand.Uint64()|1)
	}
	parentTPs := make([]string, len(tps))
	for i, tp := range tps {
		parentTPs[i] = tp[:len(tp)-2] + "00"
		if i%100 == 0 {
			parentTPs[i] = tp
		}
	}
	for _, shape := range []string{"sdk-2spans", "sdk-1span", "full", "lean", "fold", "off-tp", "1pct", "1pct-parent"} {
		b.Run(shape, func(b *testing.B) {
			exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink.URL+"/v1/traces"))
			if err != nil {
				b.Fatal(err)
			}
			sampler, in := sdktrace.ParentBased(sdktrace.AlwaysSample()), tps
			switch shape {
			case "1pct":
				ratio := sdktrace.TraceIDRatioBased(0.01)
				sampler = sdktrace.ParentBased(ratio, sdktrace.WithRemoteParentSampled(ratio))
			case "1pct-parent":
				in = parentTPs
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, sdktrace.WithMaxQueueSize(8192),
				sdktrace.WithMaxExportBatchSize(2048), sdktrace.WithBlocking()), sdktrace.WithSampler(sampler))
			defer func() { _ = tp.Shutdown(context.Background()) }()
			tr := Tracer(tp)
			switch shape {
			case "off-tp":
				tr = Tracer(nil)
			case "1pct-parent":
				tr = Tracer(ParentBased(tp))
			}
			attempt := floorAttempt(tr, shape)
			cpu0 := cpuNow()
			i := 0
			for b.Loop() {
				attempt(in[i%len(in)])
				i++
			}
			if err := tp.ForceFlush(context.Background()); err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64((cpuNow()-cpu0).Microseconds())/float64(b.N), "cpu-µs/attempt")
		})
	}
}

// floorAttempt is one attempt's spans in shape, for a task whose
// creation context is its argument.
func floorAttempt(tr trace.Tracer, shape string) func(tp string) {
	c := NewConsumer(tr, "bench", "jobs", "worker-1")
	switch shape {
	case "lean":
		c.SetWaitShape(WaitSpanLean)
	case "fold":
		c.SetWaitShape(WaitFolded)
	}
	if shape == "sdk-2spans" || shape == "sdk-1span" {
		same := []attribute.KeyValue{c.system, c.dest, c.ns}
		return func(tp string) {
			claimed := time.Now()
			sc, _ := Parse(tp)
			parent := trace.ContextWithRemoteSpanContext(context.Background(), sc)
			named := append(same[:3:3], semconv.MessagingMessageID("t00001234"), AttrTaskType.String("noop"))
			_, span := tr.Start(parent, c.name, c.kind, trace.WithTimestamp(claimed), trace.WithLinks(trace.Link{SpanContext: sc}))
			span.SetAttributes(append(named, c.client, c.group, c.op, c.opName, AttrAttempt.Int(1), AttrTakeover.Bool(false))...)
			if shape == "sdk-2spans" {
				_, w := tr.Start(parent, c.waitName, trace.WithTimestamp(claimed.Add(-time.Millisecond)))
				w.SetAttributes(append(named, AttrAttempt.Int(1), AttrDeferrals.Int(0))...)
				w.End(trace.WithTimestamp(claimed))
			}
			span.SetAttributes(AttrAttemptEnd.String(EndSuccess))
			span.End()
		}
	}
	return func(tp string) {
		claimed := time.Now()
		ctx, parent, span := c.Start(context.Background(), tp, claimed)
		if span.IsRecording() {
			_ = c.Describe(ctx, parent, span, &Attempt{TaskID: "t00001234", TaskType: "noop", Number: 1,
				Ready: claimed.Add(-time.Millisecond), Claimed: claimed})
		}
		EndProcess(span, EndSuccess, nil)
	}
}

// cpuNow is the CPU time (user and system) the process has used.
func cpuNow() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
