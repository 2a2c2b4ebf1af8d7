package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// BenchmarkQueue submits b.N no-op tasks, then processes them with one worker
// at concurrency 64, against an embedded etcd with fsync on. It reports the
// submit rate and the processing rate (tasks/s).
func BenchmarkQueue(b *testing.B) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	cli := s.Client(b)
	c, err := queue.NewClient(cli, "bench")
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	in := make([]queue.Task, b.N)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop"}
	}
	b.ResetTimer()
	start := time.Now()
	if _, err := c.Submit(ctx, "jobs", in, nil); err != nil {
		b.Fatal(err)
	}
	submitted := time.Since(start)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: "bench", Queue: "jobs", Concurrency: 64, Prefetch: 64, Drain: true})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close(ctx)
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) { return nil, nil })
	start = time.Now()
	if err := w.Run(ctx); err != nil {
		b.Fatal(err)
	}
	processed := time.Since(start)
	b.StopTimer()
	if st := w.Stats(); st.Succeeded != int64(b.N) {
		b.Fatalf("succeeded %d of %d", st.Succeeded, b.N)
	}
	b.ReportMetric(float64(b.N)/submitted.Seconds(), "submit/s")
	b.ReportMetric(float64(b.N)/processed.Seconds(), "process/s")
}
