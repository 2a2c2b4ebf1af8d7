package flow_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkFlowOverhead processes b.N no-op tasks (10 tenants) with one
// worker at concurrency 64, against one embedded etcd with fsync on: with no
// flow control, with a shared rate limit far above the achievable rate, and
// with a per-tenant quota far above it. Compare process/s across the three.
func BenchmarkFlowOverhead(b *testing.B) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	for _, mode := range []string{"none", "ratelimit", "quota"} {
		b.Run(mode, func(b *testing.B) { runOverhead(b, s, mode) })
	}
}

func runOverhead(b *testing.B, s *etcdtest.Server, mode string) {
	cli := s.Client(b)
	ns := fmt.Sprintf("bench-%s-%d", mode, time.Now().UnixNano())
	ctx := context.Background()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		b.Fatal(err)
	}
	in := make([]queue.Task, b.N)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop", Metadata: queue.Metadata{Tenant: fmt.Sprintf("tenant-%d", i%10)}}
	}
	if _, err := c.Submit(ctx, "jobs", in, nil); err != nil {
		b.Fatal(err)
	}
	l, err := lease.Grant(ctx, cli, 10*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close(ctx)
	var gates []queue.Gate
	switch mode {
	case "ratelimit":
		r, _ := flow.ParseRate("rate", "1000000/s")
		lim, err := flow.NewLimiter(ctx, cli, ns, "api", &r)
		if err != nil {
			b.Fatal(err)
		}
		defer lim.Close(ctx)
		gates = append(gates, fleet.Gate(flow.RateGate(lim)))
	case "quota":
		q, err := flow.NewQuota(ctx, cli, ns, flow.PerTenant, flow.QuotaConfig{Limit: 10000}, func() clientv3.LeaseID { return l.ID() })
		if err != nil {
			b.Fatal(err)
		}
		defer q.Close(context.Background())
		gates = append(gates, fleet.Gate(flow.QuotaGate(q)))
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 64, Prefetch: 64, Drain: true, Lease: l, Gates: gates})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close(ctx)
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) { return nil, nil })
	b.ResetTimer()
	start := time.Now()
	if err := w.Run(ctx); err != nil {
		b.Fatal(err)
	}
	processed := time.Since(start)
	b.StopTimer()
	if st := w.Stats(); st.Succeeded != int64(b.N) {
		b.Fatalf("succeeded %d of %d", st.Succeeded, b.N)
	}
	b.ReportMetric(float64(b.N)/processed.Seconds(), "process/s")
	b.ReportMetric(0, "ns/op")
}
