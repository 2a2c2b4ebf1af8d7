package queue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/tracing"
	"github.com/droverhq/drover/tracing/otelspan"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// pairVariant is one way of running the queue benchmark's slice.
type pairVariant struct {
	ratio  float64 // sampled share; 0: tracing off (the global no-op provider)
	traced bool    // tasks carry a sampled traceparent of their own
	shape  otelspan.WaitShape
	// parent: the submission decided, as parentbased_traceidratio does
	// where the tasks are submitted: ratio of the tasks' traceparents are
	// sampled, and the worker's provider follows them (otelspan.ParentBased).
	parent bool
}

// pairVariants are the variants TestTracingCostPaired knows.
var pairVariants = map[string]pairVariant{
	"off": {}, "off-tp": {traced: true},
	"1pct": {ratio: 0.01, traced: true}, "100pct": {ratio: 1, traced: true},
	"1pct-lean":   {ratio: 0.01, traced: true, shape: otelspan.WaitSpanLean},
	"100pct-lean": {ratio: 1, traced: true, shape: otelspan.WaitSpanLean},
	"1pct-fold":   {ratio: 0.01, traced: true, shape: otelspan.WaitFolded},
	"100pct-fold": {ratio: 1, traced: true, shape: otelspan.WaitFolded},
	"1pct-parent": {ratio: 0.01, traced: true, parent: true},
}

// TestTracingCostPaired measures what tracing costs the queue benchmark
// (BenchmarkQueue's no-op tasks, one worker at concurrency 64, fsync on,
// spans exported over OTLP/HTTP to a discarding receiver in a process of
// its own) as paired ratios: DROVER_TRACE_PAIRS rounds, each running
// every variant of DROVER_TRACE_VARIANTS (default off,1pct,100pct; the
// first is the baseline) on DROVER_TRACE_TASKS tasks (default 5,000), in
// this one process, one after the other, in an order that rotates from
// round to round. Each variant's tasks/s and CPU µs per task are divided
// by the same round's baseline's, and the medians of those ratios
// reported: a load that comes and goes moves both runs of a round, which
// separate processes minutes apart do not share.
func TestTracingCostPaired(t *testing.T) {
	rounds, _ := strconv.Atoi(os.Getenv("DROVER_TRACE_PAIRS"))
	if rounds <= 0 {
		t.Skip("set DROVER_TRACE_PAIRS to measure")
	}
	n := 5000
	if v, err := strconv.Atoi(os.Getenv("DROVER_TRACE_TASKS")); err == nil && v > 0 {
		n = v
	}
	names := []string{"off", "1pct", "100pct"}
	if v := os.Getenv("DROVER_TRACE_VARIANTS"); v != "" {
		names = strings.Split(v, ",")
	}
	for _, name := range names {
		if _, ok := pairVariants[name]; !ok {
			t.Fatalf("unknown variant %q", name)
		}
	}
	sink := startSink(t)
	rate := map[string][]float64{}
	cpu := map[string][]float64{}
	for r := 0; r < rounds; r++ {
		for i := range names {
			name := names[(i+r)%len(names)]
			tps, us := pairSlice(t, sink, pairVariants[name], n)
			rate[name], cpu[name] = append(rate[name], tps), append(cpu[name], us)
		}
	}
	base := names[0]
	t.Logf("%d rounds of %d tasks; medians of the ratios to %s in the same round", rounds, n, base)
	t.Logf("%-12s %8s %6s %13s %11s %6s %13s", "variant", "tasks/s", "ratio", "(quartiles)", "cpu-µs/task", "ratio", "(quartiles)")
	for _, name := range names {
		rr, cr := make([]float64, rounds), make([]float64, rounds)
		for r := range rounds {
			rr[r], cr[r] = rate[name][r]/rate[base][r], cpu[name][r]/cpu[base][r]
		}
		t.Logf("%-12s %8.0f %6.3f %13s %11.1f %6.3f %13s", name, median(rate[name]), median(rr), quartiles(rr),
			median(cpu[name]), median(cr), quartiles(cr))
		t.Logf("  %s, each round: tasks/s %s; cpu %s", name, fmtRatios(rr), fmtRatios(cr))
	}
}

// quartiles writes the first and third quartiles of xs.
func quartiles(xs []float64) string {
	s := slices.Sorted(slices.Values(xs))
	return fmt.Sprintf("(%.2f-%.2f)", s[len(s)/4], s[(3*len(s))/4])
}

// pairSlice runs n no-op tasks of variant v and returns the rate at which
// the worker processed them and the process's CPU µs per task meanwhile,
// the export of their spans included.
func pairSlice(t *testing.T, sink string, v pairVariant, n int) (rate, cpuUS float64) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	var tp trace.TracerProvider
	var sdk *sdktrace.TracerProvider
	if v.ratio > 0 {
		exp, err := otlptracehttp.New(context.Background(), otlptracehttp.WithEndpointURL(sink+"/v1/traces"))
		if err != nil {
			t.Fatal(err)
		}
		ratio := sdktrace.TraceIDRatioBased(v.ratio)
		sampler := sdktrace.ParentBased(ratio, sdktrace.WithRemoteParentSampled(ratio))
		if v.parent {
			sampler = sdktrace.ParentBased(ratio)
		}
		sdk = sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, tracing.BatchOptions()...), sdktrace.WithSampler(sampler))
		defer func() { _ = sdk.Shutdown(context.Background()) }()
		tp = sdk
		if v.parent {
			tp = otelspan.ParentBased(sdk)
		}
	}
	ctx := context.Background()
	cli := s.Client(t)
	c, err := queue.NewClient(cli, "bench", queue.WithTracerProvider(tp))
	if err != nil {
		t.Fatal(err)
	}
	in := make([]queue.Task, n)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop"}
		if v.traced {
			flags := 1
			if v.parent && rand.Float64() >= v.ratio {
				flags = 0
			}
			in[i].TraceParent = fmt.Sprintf("00-%016x%016x-%016x-%02x", rand.Uint64()|1, rand.Uint64(), rand.Uint64()|1, flags)
		}
	}
	if _, err := c.Submit(ctx, "jobs", in, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: "bench", Queue: "jobs", Concurrency: 64, Prefetch: 64, Drain: true, TracerProvider: tp})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	queue.SetWaitShape(w, v.shape)
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	runtime.GC()
	start, cpu0 := time.Now(), cpuTime()
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if sdk != nil {
		if err := sdk.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	took, used := time.Since(start), cpuTime()-cpu0
	if st := w.Stats(); st.Succeeded != int64(n) {
		t.Fatalf("succeeded %d of %d", st.Succeeded, n)
	}
	return float64(n) / took.Seconds(), float64(used.Microseconds()) / float64(n)
}

// median is the median of xs.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// fmtRatios writes ratios for a log line.
func fmtRatios(xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = strconv.FormatFloat(x, 'f', 2, 64)
	}
	return strings.Join(parts, " ")
}
