package queue_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// delayedCeiling is TestDelayedAtScale's ceiling mode
// (DROVER_BENCH_SCALE_NOW=1): the highest rate at which the same server
// and workers claim and complete tasks that are due now, the least a
// delayed task can cost whatever the due index. It submits N tasks
// (DROVER_BENCH_SCALE, default 2,000) to queue "now" without a due time,
// 10,000 a request (DROVER_BENCH_SCALE_REQUEST), two requests at a time,
// into a `drover server` process with DROVER_BIN (else an embedded etcd);
// once all are pending it starts the workers (DROVER_BENCH_SCALE_WORKERS,
// default 2, of concurrency DROVER_BENCH_SCALE_CONCURRENCY, default 64,
// claiming up to DROVER_BENCH_SCALE_PREFETCH, default the concurrency up
// to 100) and reports the tasks claimed a second over the whole run and
// between the 10th and 90th percent claimed (the steady rate), completed
// a second (Stats' succeeded count), the CPU a task of the server and of
// the workers (this process), and what a due index that cost nothing
// would then give the delayed tasks' goal (ceilingImplies). It asserts
// that every task is claimed exactly once in its tail (DROVER_BENCH_SCALE_TAIL).
func delayedCeiling(t *testing.T) {
	n := 2000
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE")); v > 0 {
		n = v
	}
	var cli *clientv3.Client
	pid := 0
	if bin := os.Getenv("DROVER_BIN"); bin != "" {
		cli, pid = startServerProcess(t, bin, "bench")
	} else {
		s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		cli = s.Client(t)
	}
	c, err := queue.NewClient(cli, "bench")
	if err != nil {
		t.Fatal(err)
	}
	submitted := submitNow(t, c, n)
	st, err := c.Stats(context.Background(), "now")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d tasks submitted due now in %v (%.0f a second), %d pending", n, submitted.Round(time.Millisecond), float64(n)/submitted.Seconds(), st.Pending)
	time.Sleep(2 * time.Second) // the submission's writes settle
	opsReset, opsLog := countOps(t, cli, "bench")
	var cpu0, own0 time.Duration
	if pid != 0 {
		cpu0, own0 = processCPU(t, pid), processCPU(t, os.Getpid())
	}
	if opsReset != nil {
		opsReset()
	}
	began := time.Now()
	profileWindow(t, began, 20*time.Second)
	claims, dups, stop := startCeilingWorkers(t, cli, n, began.Add(tail(n)))
	claimed := claims()
	done := waitSucceeded(t, c, n, began, began.Add(tail(n)+time.Minute))
	var srv, own time.Duration
	if pid != 0 {
		srv, own = processCPU(t, pid)-cpu0, processCPU(t, os.Getpid())-own0
	}
	stop()
	if opsLog != nil && len(claimed) > 0 {
		opsLog(len(claimed))
	}
	if len(claimed) < n {
		t.Fatalf("only %d of %d tasks claimed %v after the workers started", len(claimed), n, tail(n))
	}
	if d := dups(); d > 0 {
		t.Fatalf("%d tasks claimed twice", d)
	}
	at := func(p float64) time.Duration {
		return time.Duration(claimed[min(n-1, int(p*float64(n)))] - began.UnixNano())
	}
	last := at(1)
	steady := 0.8 * float64(n) / (at(0.9) - at(0.1)).Seconds()
	t.Logf("%d claimed in %v: %.0f a second; between the 10th and 90th percent (%v to %v) %.0f a second; all succeeded after %v: %.0f completed a second",
		n, last.Round(time.Millisecond), float64(n)/last.Seconds(), at(0.1).Round(time.Millisecond), at(0.9).Round(time.Millisecond),
		steady, done.Round(time.Millisecond), float64(n)/done.Seconds())
	if pid != 0 {
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(n) }
		t.Logf("CPU a task, from the workers' start to the last success: server %.1f µs, workers %.1f µs, both %.1f µs (%v and %v over %v: %.2f cores)",
			per(srv), per(own), per(srv+own), srv, own, done.Round(time.Millisecond), (srv+own).Seconds()/done.Seconds())
	}
	t.Log(ceilingImplies(steady, 1000000, time.Minute))
}

// ceilingImplies says what a due index that cost nothing would give n
// tasks due evenly over window if tasks can be claimed at most ceiling a
// second (perfectLateness).
func ceilingImplies(ceiling float64, n int, window time.Duration) string {
	rate := float64(n) / window.Seconds()
	late := perfectLateness(ceiling, n, window)
	if late == nil {
		return fmt.Sprintf("%d due over %v fall due at %.0f a second, %.0f%% of this ceiling (%.0f): a perfect due index is not bounded by it",
			n, window, rate, 100*rate/ceiling, ceiling)
	}
	return fmt.Sprintf("%d due over %v fall due at %.0f a second, %.2fx this ceiling (%.0f): the backlog grows %.0f a second to %.0f at the window's end; "+
		"a perfect due index would claim them late by p50 %v, p99 %v, max %v (goal p99 100ms)",
		n, window, rate, rate/ceiling, ceiling, rate-ceiling, (rate-ceiling)*window.Seconds(),
		late(0.5).Round(time.Millisecond), late(0.99).Round(time.Millisecond), late(1).Round(time.Millisecond))
}

// perfectLateness is the lateness at quantile p of n tasks due evenly over
// window, claimed in due order at most ceiling a second and at once when
// they can be, or nil when ceiling is at least the rate they fall due at.
// Above it the backlog grows by the difference every second, and the task
// due at t into the window waits for the backlog ahead of it: it is
// claimed when ceiling×t' = rate×t, late by t×(rate/ceiling − 1), so the
// lateness spreads evenly from 0 to window×(rate/ceiling − 1).
func perfectLateness(ceiling float64, n int, window time.Duration) func(p float64) time.Duration {
	rate := float64(n) / window.Seconds()
	if ceiling >= rate {
		return nil
	}
	k := rate/ceiling - 1
	return func(p float64) time.Duration { return time.Duration(p * k * float64(window)) }
}

// TestPerfectLateness holds the ceiling's arithmetic: a million due over a
// minute is 16,667 a second; at half that rate the backlog doubles the
// time, so the last is a window late and the p99 0.99 of it; at or above
// the rate nothing is late on account of the ceiling.
func TestPerfectLateness(t *testing.T) {
	late := perfectLateness(1e6/120, 1000000, time.Minute)
	if late == nil {
		t.Fatal("half the rate: no lateness")
	}
	for _, c := range []struct {
		p    float64
		want time.Duration
	}{{0.5, 30 * time.Second}, {0.99, 59400 * time.Millisecond}, {1, time.Minute}} {
		if got := late(c.p); (got - c.want).Abs() > time.Millisecond {
			t.Errorf("p%v: %v, want %v", c.p*100, got, c.want)
		}
	}
	if late := perfectLateness(16667, 1000000, time.Minute); late != nil {
		t.Errorf("at the rate: lateness p99 %v, want none", late(0.99))
	}
	if late := perfectLateness(3276, 1000000, time.Minute); late == nil || late(0.99) < 4*time.Minute {
		t.Errorf("at 3,276 a second: the p99 of a perfect index should be over 4 minutes")
	}
}

// submitNow submits n tasks to queue "now" without a due time, as
// submitSpread does its delayed ones, and returns how long that took.
func submitNow(t *testing.T, c *queue.Client, n int) time.Duration {
	t.Helper()
	began := time.Now()
	per := 10000
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE_REQUEST")); v > 0 {
		per = v
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for part := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for from := part * per; from < n; from += 2 * per {
				in := make([]queue.Task, 0, per)
				for i := from; i < min(from+per, n); i++ {
					in = append(in, queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop", Parameters: []byte(strconv.Itoa(i))})
				}
				if _, err := c.Submit(context.Background(), "now", in, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	return time.Since(began)
}

// startCeilingWorkers starts the ceiling's workers on queue "now" and
// returns claims, which waits until n tasks were claimed (or until) and
// returns the times (Unix nanoseconds) the handlers started, in order;
// dups, the tasks whose handler ran more than once; and stop, which stops
// the workers.
func startCeilingWorkers(t *testing.T, cli *clientv3.Client, n int, until time.Time) (claims func() []int64, dups func() int, stop func()) {
	t.Helper()
	workers, conc := 2, 64
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE_WORKERS")); v > 0 {
		workers = v
	}
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE_CONCURRENCY")); v > 0 {
		conc = v
	}
	prefetch := min(conc, 100)
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE_PREFETCH")); v > 0 {
		prefetch = v
	}
	t.Logf("%d workers of concurrency %d, claiming up to %d", workers, conc, prefetch)
	var mu sync.Mutex
	times := make([]int64, 0, n)
	seen := make([]atomic.Int32, n)
	all := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var ws []*queue.Worker
	for range workers {
		w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: "bench", Queue: "now", Concurrency: conc, Prefetch: prefetch})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		ws = append(ws, w)
		w.HandleAll(func(_ context.Context, tk *queue.Task) ([]byte, error) {
			now := time.Now().UnixNano()
			if i, err := strconv.Atoi(string(tk.Parameters)); err == nil && i >= 0 && i < n && seen[i].Add(1) > 1 {
				return nil, nil
			}
			mu.Lock()
			defer mu.Unlock()
			if len(times) < n {
				times = append(times, now)
				if len(times) == n {
					close(all)
				}
			}
			return nil, nil
		})
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
	stop = sync.OnceFunc(func() {
		cancel()
		wg.Wait()
		for _, w := range ws {
			_ = w.Close(context.Background())
		}
	})
	t.Cleanup(stop)
	claims = func() []int64 {
		progress := time.NewTicker(10 * time.Second)
		defer progress.Stop()
		end := time.After(time.Until(until))
		prev := 0
		for {
			select {
			case <-all:
			case <-end:
			case <-progress.C:
				mu.Lock()
				k := len(times)
				mu.Unlock()
				t.Logf("%d claimed (%.0f a second over the last 10 s)", k, float64(k-prev)/10)
				prev = k
				continue
			}
			mu.Lock()
			defer mu.Unlock()
			// Handlers start in parallel: appended nearly in order.
			out := slices.Clone(times)
			slices.Sort(out)
			return out
		}
	}
	dups = func() int {
		d := 0
		for i := range seen {
			if seen[i].Load() > 1 {
				d++
			}
		}
		return d
	}
	return claims, dups, stop
}

// waitSucceeded polls the queue's Stats until n tasks succeeded (or until)
// and returns how long after began that was seen.
func waitSucceeded(t *testing.T, c *queue.Client, n int, began, until time.Time) time.Duration {
	t.Helper()
	for time.Now().Before(until) {
		st, err := c.Stats(context.Background(), "now")
		if err == nil && st.Succeeded >= int64(n) {
			return time.Since(began)
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("%d tasks did not all succeed by %v", n, until)
	return 0
}
