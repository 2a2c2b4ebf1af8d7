package httpapi_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"net/http"
	"slices"

	"github.com/droverhq/drover/internal/testenv/steal"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// benchTasks is how many no-op tasks each side of BenchmarkQueueClaimAck
// drains per iteration.
const benchTasks = 100000

// BenchmarkQueueClaimAck compares draining no-op tasks through 64 HTTP
// workers (keep-alive connections, one session each, claim up to 8 then
// report the 8 outcomes in one request, http-batch, or ack each,
// http-acks, or report them in a request that claims the next 8 too,
// http-pipelined) with the Go worker (concurrency 64) on the same queue layout
// of one fsync'd embedded etcd, in one run. One iteration drains
// benchTasks tasks; tasks/s and the p99 of one claim or outcome request
// (of each, and of either) are reported, with the CPU time of the whole
// process (server, etcd and clients) per task.
func BenchmarkQueueClaimAck(b *testing.B) {
	s := fsyncServer(b)
	goCli, httpCli := benchClients(b, s)
	b.Run("go", func(b *testing.B) {
		var lat latencies
		var cpu time.Duration
		var stole time.Duration // during the timed part only
		for i := 0; i < b.N; i++ {
			ns := fmt.Sprintf("bench-qgo-%d-%d", time.Now().UnixNano(), i)
			fill(b, goCli, ns)
			var done atomic.Int64
			ctx, cancel := context.WithCancel(context.Background())
			w, err := queue.NewWorker(ctx, goCli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 64})
			if err != nil {
				b.Fatal(err)
			}
			w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) {
				if done.Add(1) == benchTasks {
					cancel()
				}
				return nil, nil
			})
			b.StartTimer()
			steal0 := steal.Total()
			start, cpu0 := time.Now(), cpuTime()
			_ = w.Run(ctx)
			b.StopTimer()
			stole += steal.Total() - steal0
			cpu += cpuTime() - cpu0
			_ = w.Close(context.Background())
			lat.add(time.Since(start) / benchTasks)
		}
		b.ReportMetric(float64(b.N*benchTasks)/b.Elapsed().Seconds(), "tasks/s")
		b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*benchTasks), "cpu-µs/task")
		b.ReportMetric(float64(stole.Milliseconds()), "steal-ms")
	})
	for _, mode := range []string{"http-batch", "http-acks", "http-pipelined", "http-pipelined-32", "http-pipelined-64"} {
		b.Run(mode, func(b *testing.B) { benchHTTPWorkers(b, goCli, httpCli, mode) })
	}
}

// benchHTTPWorkers drains benchTasks tasks per iteration through 64 HTTP
// workers, which report outcomes in one batch per claim (or one ack per
// task), and reports tasks/s and the p99 of a request: a claim, an outcome
// request, and either. The tasks are submitted through goCli; the HTTP
// API calls etcd through httpCli (benchClients).
func benchHTTPWorkers(b *testing.B, goCli, httpCli *clientv3.Client, mode string) {
	var claims, outs, all latencies
	var cpu time.Duration
	var stole time.Duration // during the timed part only
	for i := 0; i < b.N; i++ {
		ns := fmt.Sprintf("bench-qhttp-%d-%d", time.Now().UnixNano(), i)
		fill(b, goCli, ns)
		base, hc := benchAPI(b, httpCli, ns)
		var left atomic.Int64
		left.Store(benchTasks)
		var wg sync.WaitGroup
		errs := make(chan error, 64)
		b.StartTimer()
		steal0 := steal.Total()
		cpu0 := cpuTime()
		for c := 0; c < 64; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := httpWorker(hc, base, mode, &left, &claims, &outs); err != nil {
					errs <- err
				}
			}()
		}
		wg.Wait()
		b.StopTimer()
		stole += steal.Total() - steal0
		cpu += cpuTime() - cpu0
		close(errs)
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
	all.d = append(append(all.d, claims.d...), outs.d...)
	all.report(b)
	b.ReportMetric(p99ms(claims.d), "claim-p99-ms")
	b.ReportMetric(p99ms(outs.d), "outcome-p99-ms")
	b.ReportMetric(float64(b.N*benchTasks)/b.Elapsed().Seconds(), "tasks/s")
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*benchTasks), "cpu-µs/task")
	b.ReportMetric(float64(stole.Milliseconds()), "steal-ms")
}

// p99ms is the 99th percentile of d, in milliseconds.
func p99ms(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	d = slices.Clone(d)
	slices.Sort(d)
	return float64(d[len(d)*99/100].Microseconds()) / 1000
}

// fill submits benchTasks no-op tasks to queue q of ns.
func fill(b *testing.B, cli *clientv3.Client, ns string) {
	b.StopTimer()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		b.Fatal(err)
	}
	tasks := make([]queue.Task, benchTasks)
	for i := range tasks {
		tasks[i] = queue.Task{ID: fmt.Sprintf("t%d", i), Type: "noop"}
	}
	if _, err := c.Submit(context.Background(), "q", tasks, nil); err != nil {
		b.Fatal(err)
	}
}

// claimed is the tasks of a claim's (or an outcome batch's) answer.
type claimed struct {
	Tasks []struct {
		ID    string `json:"task_id"`
		Token int64  `json:"token"`
	} `json:"tasks"`
}

// httpWorker claims up to 8 tasks at a time and reports their outcomes,
// until left reaches 0: in one request (http-batch), one ack each
// (http-acks), or in one request that also claims the next 8
// (http-pipelined), or the next 32 (http-pipelined-32: claims as large as
// the language clients' workers make while tasks are short).
func httpWorker(hc *http.Client, base, mode string, left *atomic.Int64, claims, outs *latencies) error {
	most := 8
	switch mode {
	case "http-pipelined-32":
		most, mode = 32, "http-pipelined"
	case "http-pipelined-64":
		most, mode = 64, "http-pipelined"
	}
	var sess struct{ ID string }
	if err := call(hc, "POST", base+"/v1/sessions", map[string]any{"ttl": 30}, 201, &sess); err != nil {
		return err
	}
	var got claimed
	for left.Load() > 0 {
		if len(got.Tasks) == 0 {
			start := time.Now()
			if err := call(hc, "POST", base+"/v1/queues/q/claim", map[string]any{"session": sess.ID, "max": most, "wait": "200ms"}, 200, &got); err != nil {
				return err
			}
			if len(got.Tasks) == 0 {
				continue // a claim that found nothing waited its 200 ms on purpose: not a latency
			}
			claims.add(time.Since(start))
		}
		if mode == "http-acks" {
			for _, t := range got.Tasks {
				start := time.Now()
				if err := call(hc, "POST", fmt.Sprintf("%s/v1/queues/q/tasks/%s/ack", base, t.ID), map[string]any{"session": sess.ID, "token": t.Token}, 200, nil); err != nil {
					return err
				}
				outs.add(time.Since(start))
				left.Add(-1)
			}
			got.Tasks = nil
			continue
		}
		os := make([]map[string]any, len(got.Tasks))
		for i, t := range got.Tasks {
			os[i] = map[string]any{"task_id": t.ID, "token": t.Token}
		}
		body := map[string]any{"session": sess.ID, "outcomes": os}
		if mode == "http-pipelined" {
			body["claim"] = map[string]any{"max": most}
		}
		var res struct {
			Results []struct{ Status int }
			claimed
		}
		start := time.Now()
		if err := call(hc, "POST", base+"/v1/queues/q/outcomes", body, 200, &res); err != nil {
			return err
		}
		outs.add(time.Since(start))
		for _, r := range res.Results {
			if r.Status != 200 {
				return fmt.Errorf("an outcome answered %d", r.Status)
			}
		}
		left.Add(-int64(len(got.Tasks)))
		got = res.claimed
	}
	return nil
}
