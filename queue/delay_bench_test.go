package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDelayedLatenessMeasure measures delayed tasks: it submits N tasks
// (DROVER_BENCH_DELAY=N; skipped without it) due at random times over a
// window (DROVER_BENCH_DELAY_WINDOW, default 10s) that starts once they are
// all in, against an embedded etcd with fsync on, with two idle workers of
// concurrency 64 ready. It reports the etcd bytes (keys and values) stored
// per scheduled task while they wait, and how late each is claimed (p50,
// p99, max), failing if any is claimed early. A measurement, not a timed
// test: it asserts no time bound.
func TestDelayedLatenessMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_DELAY"))
	if n <= 0 {
		t.Skip("set DROVER_BENCH_DELAY=N to measure N delayed tasks")
	}
	window := 10 * time.Second
	if v, err := time.ParseDuration(os.Getenv("DROVER_BENCH_DELAY_WINDOW")); err == nil {
		window = v
	}
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	cli := s.Client(t)
	c, err := queue.NewClient(cli, "bench")
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// Due times are drawn first, relative to a start the submission is
	// given ahead: the window opens after the submission ends.
	offsets := make([]time.Duration, n)
	for i := range offsets {
		offsets[i] = time.Duration(rand.Int64N(int64(window)))
	}
	lead := 3*time.Second + time.Duration(n/5000)*time.Second
	start := time.Now().Add(lead)
	in := make([]queue.Task, n)
	for i := range in {
		due := start.Add(offsets[i])
		in[i] = queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop", RunAt: due,
			Parameters: json.RawMessage(strconv.FormatInt(due.UnixNano(), 10))}
	}
	submitStart := time.Now()
	for from := 0; from < n; from += 10000 {
		if _, err := c.Submit(ctx, "later", in[from:min(from+10000, n)], nil); err != nil {
			t.Fatal(err)
		}
	}
	submitted := time.Since(submitStart)
	if time.Now().After(start) {
		t.Fatalf("the submission took %v, past the window's start %v after it began: raise the lead", submitted, lead)
	}
	bytes, keys := storedBytes(t, cli, "/bench/")
	st, _ := c.Stats(ctx, "later")
	lateness := runDelayedWorkers(t, cli, n)
	slices.Sort(lateness)
	pct := func(p float64) time.Duration { return lateness[min(len(lateness)-1, int(p*float64(len(lateness))))] }
	t.Logf("%d tasks due over %v (submitted in %v, %d scheduled): %d keys, %.0f etcd bytes per task; claimed late by p50 %v, p99 %v, max %v; early: %d",
		n, window, submitted.Round(time.Millisecond), st.Scheduled, keys, float64(bytes)/float64(n),
		pct(0.5).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), lateness[len(lateness)-1].Round(time.Millisecond), early(lateness))
	if e := early(lateness); e > 0 {
		t.Fatalf("%d tasks claimed before their time", e)
	}
}

// storedBytes sums the sizes of the keys and values under prefix.
func storedBytes(t *testing.T, cli *clientv3.Client, prefix string) (bytes int64, keys int) {
	t.Helper()
	for from := prefix; ; {
		g, err := cli.Get(context.Background(), from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithLimit(5000))
		if err != nil {
			t.Fatal(err)
		}
		for _, kv := range g.Kvs {
			bytes += int64(len(kv.Key) + len(kv.Value))
		}
		keys += len(g.Kvs)
		if !g.More || len(g.Kvs) == 0 {
			return bytes, keys
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// runDelayedWorkers runs two workers until n tasks were claimed and returns
// how late each was claimed after its due time (in its parameters).
func runDelayedWorkers(t *testing.T, cli *clientv3.Client, n int) []time.Duration {
	t.Helper()
	return startDelayedWorkers(t, cli, "bench", n, time.Now().Add(10*time.Minute))()
}

// startDelayedWorkers starts two workers of namespace ns, idle and ready,
// and returns a wait that returns, once n tasks were claimed (or at
// until, with those claimed by then), how late each was claimed after its
// due time (in its parameters), and stops them.
func startDelayedWorkers(t *testing.T, cli *clientv3.Client, ns string, n int, until time.Time) (wait func() []time.Duration) {
	t.Helper()
	var mu sync.Mutex
	lateness := make([]time.Duration, 0, n)
	all := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var workers []*queue.Worker
	for range 2 {
		w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "later", Concurrency: 64, Prefetch: 64})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		workers = append(workers, w)
		w.HandleAll(func(_ context.Context, tk *queue.Task) ([]byte, error) {
			now := time.Now()
			due, _ := strconv.ParseInt(string(tk.Parameters), 10, 64)
			mu.Lock()
			lateness = append(lateness, now.Sub(time.Unix(0, due)))
			if len(lateness) == n {
				close(all)
			}
			mu.Unlock()
			return nil, nil
		})
		wg.Add(1)
		go func() { defer wg.Done(); _ = w.Run(ctx) }()
	}
	return func() []time.Duration {
		defer func() {
			cancel()
			wg.Wait()
			for _, w := range workers {
				_ = w.Close(context.Background())
			}
		}()
		progress := time.NewTicker(10 * time.Second)
		defer progress.Stop()
		end := time.After(time.Until(until))
	wait:
		for {
			select {
			case <-all:
				break wait
			case <-end:
				break wait
			case <-progress.C:
				mu.Lock()
				t.Logf("%d claimed", len(lateness))
				mu.Unlock()
			}
		}
		cancel()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(lateness)
	}
}

func early(lateness []time.Duration) int {
	n := 0
	for _, d := range lateness {
		if d < 0 {
			n++
		}
	}
	return n
}
