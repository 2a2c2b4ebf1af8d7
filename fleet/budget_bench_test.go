package fleet_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkBudgetOverhead processes b.N no-op tasks (10 tenants) with one
// worker at concurrency 64, against one embedded etcd with fsync on: with
// no budget ("none"), and with every task naming a budget far above the
// achievable rate with estimated_tokens, its handler reporting its usage
// through the worker's budget gate, which reserves before the handler and
// settles after it ("budget"), and the same over ten budgets, one per
// tenant ("budget-10keys": a budget's writers in one process take turns,
// different budgets' do not), and with the tasks of "budget" run without
// a gate ("meta": what their bigger records cost the queue alone).
// Compare process/s; budget-txn/task is the round trips the budget client
// made to etcd per task; cpu-us/task the CPU the whole process (worker,
// budget client and etcd) spent per task while they ran, which a shared
// machine's load moves less than the rate.
func BenchmarkBudgetOverhead(b *testing.B) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	for _, mode := range []string{"none", "budget", "budget-10keys", "meta"} {
		b.Run(mode, func(b *testing.B) { runBudgetOverhead(b, s, mode) })
	}
}

// countTxn counts the transactions a client sends to etcd.
type countTxn struct {
	clientv3.KV
	n atomic.Int64
}

func (k *countTxn) Txn(ctx context.Context) clientv3.Txn { k.n.Add(1); return k.KV.Txn(ctx) }

func runBudgetOverhead(b *testing.B, s *etcdtest.Server, mode string) {
	cli := s.Client(b)
	ns := fmt.Sprintf("bench-%s-%d", mode, time.Now().UnixNano())
	ctx := context.Background()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		b.Fatal(err)
	}
	const key = "openai/gpt-4.1/key-bench"
	in := make([]queue.Task, b.N)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop", Metadata: queue.Metadata{Tenant: fmt.Sprintf("tenant-%d", i%10)}}
		switch mode {
		case "budget", "meta":
			in[i].Metadata.Budget, in[i].Metadata.EstimatedTokens = key, 100
		case "budget-10keys":
			in[i].Metadata.Budget, in[i].Metadata.EstimatedTokens = fmt.Sprintf("%s-%d", key, i%10), 100
		}
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
	var gate *fleet.BudgetGate
	bcli := s.Client(b)
	kv := &countTxn{KV: bcli.KV}
	bcli.KV = kv
	if mode != "none" && mode != "meta" {
		bc := budget.New(bcli, ns)
		defer bc.Close()
		for _, k := range []string{key, key + "-0", key + "-1", key + "-2", key + "-3", key + "-4", key + "-5", key + "-6", key + "-7", key + "-8", key + "-9"} {
			if _, err := bc.Set(ctx, budget.Budget{Key: k, Tokens: budget.MaxTokens, Requests: budget.MaxTokens, WindowSeconds: budget.MaxWindowSeconds}); err != nil {
				b.Fatal(err)
			}
		}
		gate = fleet.NewBudgetGate(bc, func() clientv3.LeaseID { return l.ID() }, nil)
		gates = append(gates, gate)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 64, Prefetch: 64, Drain: true, Lease: l, Gates: gates})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Close(ctx)
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		if gate != nil {
			gate.Used(t, 90)
		}
		return nil, nil
	})
	kv.n.Store(0)
	b.ResetTimer()
	cpu0 := processCPU(b)
	start := time.Now()
	if err := w.Run(ctx); err != nil {
		b.Fatal(err)
	}
	if gate != nil { // the settles after the last outcomes count too
		if err := gate.Flush(ctx); err != nil {
			b.Fatal(err)
		}
	}
	processed := time.Since(start)
	cpu := processCPU(b) - cpu0
	b.StopTimer()
	if st := w.Stats(); st.Succeeded != int64(b.N) {
		b.Fatalf("succeeded %d of %d", st.Succeeded, b.N)
	}
	b.ReportMetric(float64(b.N)/processed.Seconds(), "process/s")
	b.ReportMetric(float64(kv.n.Load())/float64(b.N), "budget-txn/task")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/task")
	b.ReportMetric(0, "ns/op")
}

// processCPU is the user and system CPU time the process has spent.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
