package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/steal"
	"github.com/droverhq/drover/queue"
)

// benchRate is the offered load of the latency benchmarks, per second
// (DROVER_BENCH_RATE, default def): below what either side sustains, so
// that the latencies are the requests' own and not a queue's in front of
// a saturated machine.
func benchRate(b *testing.B, def int) int {
	if v := os.Getenv("DROVER_BENCH_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("DROVER_BENCH_RATE=%q: want a positive number of operations a second", v)
		}
		return n
	}
	return def
}

// openLoop runs b.N operations from n clients at rate operations a second
// in all, each started on its schedule (client c's i-th at start + (i*n+c)
// / rate), whether or not the one before it has ended. A latency is taken
// from the scheduled start, so that time spent waiting behind a slow
// operation counts (no coordinated omission). It reports p50 and p99 and
// the rate reached.
func openLoop(b *testing.B, n, rate int, op func(c int) error) {
	b.Helper()
	var lat latencies
	errs := make(chan error, n)
	var wg sync.WaitGroup
	every := time.Second / time.Duration(rate)
	b.ResetTimer()
	start, steal0 := time.Now(), steal.Total()
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i*n+c < b.N; i++ {
				at := start.Add(time.Duration(i*n+c) * every)
				time.Sleep(time.Until(at))
				if err := op(c); err != nil {
					errs <- err
					return
				}
				lat.add(time.Since(at))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	lat.report(b)
	b.ReportMetric(p50ms(lat.d), "p50-ms")
	reportStolen(b, steal0)
}

// p50ms is the median of d (sorted), in milliseconds.
func p50ms(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	return float64(d[len(d)/2].Microseconds()) / 1000
}

// BenchmarkLockLatency measures lock acquire+release cycles at an offered
// load below saturation (benchRate, default 1,000 cycles/s) from 64
// clients, each on a lock of its own, over the HTTP API and with the Go
// lock, on one fsync'd embedded etcd in one run: p50 and p99 of a cycle
// from its scheduled start.
//
//	go test ./httpapi -run '^$' -bench BenchmarkLockLatency -benchtime 10000x
func BenchmarkLockLatency(b *testing.B) {
	const clients = 64
	rate := benchRate(b, 1000)
	s := fsyncServer(b)
	goCli, httpCli := benchClients(b, s)
	b.Run("go", func(b *testing.B) {
		lockers := goLockers(b, goCli, fmt.Sprintf("bench-lgo-%d", time.Now().UnixNano()), clients)
		openLoop(b, clients, rate, func(c int) error {
			held, err := lockers[c].TryAcquire(context.Background(), fmt.Sprintf("l%d", c))
			if err != nil {
				return err
			}
			return held.Release(context.Background())
		})
	})
	b.Run("http", func(b *testing.B) {
		ns := fmt.Sprintf("bench-lhttp-%d", time.Now().UnixNano())
		base, hc := benchAPI(b, httpCli, ns)
		sessions := httpSessions(b, hc, base, clients)
		openLoop(b, clients, rate, func(c int) error {
			var got struct {
				Token     int64
				Contender string
			}
			if err := call(hc, "POST", fmt.Sprintf("%s/v1/locks/l%d", base, c), map[string]any{"session": sessions[c]}, 200, &got); err != nil {
				return err
			}
			return call(hc, "DELETE", fmt.Sprintf("%s/v1/locks/l%d?token=%d&session=%s&contender=%s", base, c, got.Token, sessions[c], got.Contender), nil, 204, nil)
		})
	})
}

// BenchmarkQueueLatency measures, at an offered load below saturation
// (benchRate, default 200 tasks/s, each submitted on its own: a
// submission of one task is an fsync'd write of a segment of its own,
// about 350/s here), how long
// a no-op task takes from the start of its submission until a worker has
// it: one Go worker (concurrency 64; its handler starts) and 64 HTTP
// workers (a claim, a long poll of 1 s, or the outcome request that
// claims again, as the language clients' workers do, is answered), on one
// fsync'd embedded etcd in one run. p50 and p99 are of tasks, from their
// submission's start; pickup-p99-ms from its answer (the task stored: what
// the workers' path adds); for the HTTP workers outcome-p99-ms is of their
// outcome requests (each with its next claim).
//
//	go test ./httpapi -run '^$' -bench BenchmarkQueueLatency -benchtime 4000x
func BenchmarkQueueLatency(b *testing.B) {
	rate := benchRate(b, 200)
	s := fsyncServer(b)
	goCli, httpCli := benchClients(b, s)
	b.Run("go", func(b *testing.B) {
		ns := fmt.Sprintf("bench-qlgo-%d", time.Now().UnixNano())
		c, err := queue.NewClient(goCli, ns)
		if err != nil {
			b.Fatal(err)
		}
		var sent sentTasks
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		w, err := queue.NewWorker(ctx, goCli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 64})
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		wg.Add(b.N)
		w.HandleAll(func(_ context.Context, t *queue.Task) ([]byte, error) {
			if sent.got(t.ID) {
				wg.Done()
			}
			return nil, nil
		})
		go func() { _ = w.Run(ctx) }()
		steal0 := steal.Total()
		submitAtRate(b, c, rate, &sent)
		wg.Wait()
		b.StopTimer()
		sent.report(b)
		reportStolen(b, steal0)
		cancel()
		_ = w.Close(context.Background())
	})
	b.Run("http", func(b *testing.B) {
		ns := fmt.Sprintf("bench-qlhttp-%d", time.Now().UnixNano())
		c, err := queue.NewClient(goCli, ns)
		if err != nil {
			b.Fatal(err)
		}
		base, hc := benchAPI(b, httpCli, ns)
		var sent sentTasks
		var outs latencies
		var left sync.WaitGroup
		left.Add(b.N)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		errs := make(chan error, 64)
		// The sessions outlive the run: the workers send no keepalives.
		ttl := 60 + 2*b.N/rate
		for i := 0; i < 64; i++ {
			go func() {
				if err := latencyWorker(ctx, hc, base, ttl, &sent, &outs, &left); err != nil && ctx.Err() == nil {
					errs <- err
				}
			}()
		}
		steal0 := steal.Total()
		submitAtRate(b, c, rate, &sent)
		all := make(chan struct{})
		go func() { left.Wait(); close(all) }()
		select {
		case <-all:
		case err := <-errs: // a worker that stopped leaves its tasks undone
			b.Fatal(err)
		}
		b.StopTimer()
		reportStolen(b, steal0)
		cancel()
		sent.report(b)
		b.ReportMetric(p99ms(outs.d), "outcome-p99-ms")
	})
}

// sentTasks is, per task id, when its submission started and when it was
// answered (the task stored), and the latencies of the tasks workers got.
type sentTasks struct {
	m sync.Map // id → *sentTask
	// lat is from a submission's start, pickup from its answer, until a
	// worker has the task.
	lat, pickup latencies
}

type sentTask struct {
	at       time.Time
	answered atomic.Pointer[time.Time]
}

// got records that a worker has task id; false if it is not one of s.
func (s *sentTasks) got(id string) bool {
	v, ok := s.m.Load(id)
	if !ok {
		return false
	}
	st := v.(*sentTask)
	now := time.Now()
	s.lat.add(now.Sub(st.at))
	if a := st.answered.Load(); a != nil && now.After(*a) {
		s.pickup.add(now.Sub(*a))
	} else {
		s.pickup.add(0) // the watch told the worker before the submission's answer came
	}
	return true
}

// report reports p50 and p99 from a submission's start (p50-ms, p99-ms)
// and p99 from its answer (pickup-p99-ms).
func (s *sentTasks) report(b *testing.B) {
	s.lat.report(b)
	b.ReportMetric(p50ms(s.lat.d), "p50-ms")
	b.ReportMetric(p99ms(s.pickup.d), "pickup-p99-ms")
}

// submitAtRate submits b.N tasks to queue q, one per request, at rate a
// second, recording in sent when each submission started and was answered.
func submitAtRate(b *testing.B, c *queue.Client, rate int, sent *sentTasks) {
	b.Helper()
	every := time.Second / time.Duration(rate)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < b.N; i++ {
		at := start.Add(time.Duration(i) * every)
		time.Sleep(time.Until(at))
		id := fmt.Sprintf("t%d", i)
		st := &sentTask{at: at}
		sent.m.Store(id, st)
		wg.Add(1)
		go func() { // on its schedule, whether or not the one before it was answered
			defer wg.Done()
			if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: id, Type: "noop"}}, nil); err != nil {
				b.Error(err)
			}
			now := time.Now()
			st.answered.Store(&now)
		}()
	}
	wg.Wait()
}

// latencyWorker is one HTTP worker of BenchmarkQueueLatency: it claims
// (a long poll of 1 s), then sends each claim's outcomes in a request that
// claims again, until ctx ends. A task's latency is taken when the worker
// has it: when the claim that took it is answered.
func latencyWorker(ctx context.Context, hc *http.Client, base string, ttl int, sent *sentTasks, outs *latencies, left *sync.WaitGroup) error {
	var sess struct{ ID string }
	if err := call(hc, "POST", base+"/v1/sessions", map[string]any{"ttl": ttl}, 201, &sess); err != nil {
		return err
	}
	var got claimed
	have := func() {
		for _, t := range got.Tasks {
			if sent.got(t.ID) {
				left.Done()
			}
		}
	}
	for ctx.Err() == nil {
		if len(got.Tasks) == 0 {
			if err := call(hc, "POST", base+"/v1/queues/q/claim", map[string]any{"session": sess.ID, "max": 8, "wait": "1s"}, 200, &got); err != nil {
				return err
			}
			have()
			continue
		}
		os := make([]map[string]any, len(got.Tasks))
		for i, t := range got.Tasks {
			os[i] = map[string]any{"task_id": t.ID, "token": t.Token}
		}
		var res struct {
			Results []struct{ Status int }
			claimed
		}
		start := time.Now()
		if err := call(hc, "POST", base+"/v1/queues/q/outcomes", map[string]any{"session": sess.ID, "outcomes": os, "claim": map[string]any{"max": 8}}, 200, &res); err != nil {
			return err
		}
		outs.add(time.Since(start))
		for _, r := range res.Results {
			if r.Status != 200 {
				return fmt.Errorf("an outcome answered %d", r.Status)
			}
		}
		got = res.claimed
		have()
	}
	return nil
}
