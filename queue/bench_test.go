package queue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"go.opentelemetry.io/otel/trace"
)

// BenchmarkQueue submits b.N no-op tasks, then processes them with one worker
// at concurrency 64, against an embedded etcd with fsync on. It reports the
// submit rate, the processing rate (tasks/s) and the CPU time the whole
// process (etcd too) spent per task processed.
func BenchmarkQueue(b *testing.B) { benchQueue(b, nil, false) }

// benchQueue is BenchmarkQueue with tp as the client's and the worker's
// TracerProvider (nil: the global one); traced gives each task a sampled
// traceparent of its own, as if each came from a traced request.
func benchQueue(b *testing.B, tp trace.TracerProvider, traced bool) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	cli := s.Client(b)
	c, err := queue.NewClient(cli, "bench", queue.WithTracerProvider(tp))
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	in := make([]queue.Task, b.N)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop"}
		if traced {
			in[i].TraceParent = fmt.Sprintf("00-%016x%016x-%016x-01", rand.Uint64()|1, rand.Uint64(), rand.Uint64()|1)
		}
	}
	b.ResetTimer()
	start := time.Now()
	if _, err := c.Submit(ctx, "jobs", in, nil); err != nil {
		b.Fatal(err)
	}
	submitted := time.Since(start)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: "bench", Queue: "jobs", Concurrency: 64, Prefetch: 64, Drain: true, TracerProvider: tp})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close(ctx)
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) { return nil, nil })
	start = time.Now()
	cpu0 := cpuTime()
	if err := w.Run(ctx); err != nil {
		b.Fatal(err)
	}
	if f, ok := tp.(interface{ ForceFlush(context.Context) error }); ok {
		// The spans still queued for export are part of the work too.
		if err := f.ForceFlush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	processed := time.Since(start)
	cpu := cpuTime() - cpu0
	b.StopTimer()
	if st := w.Stats(); st.Succeeded != int64(b.N) {
		b.Fatalf("succeeded %d of %d", st.Succeeded, b.N)
	}
	b.ReportMetric(float64(b.N)/submitted.Seconds(), "submit/s")
	b.ReportMetric(float64(b.N)/processed.Seconds(), "process/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/task")
}

// cpuTime is the CPU time (user and system) the process has used: what
// processing costs however busy the machine's other processes keep it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
