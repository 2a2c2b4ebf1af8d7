package queue_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// TestSignalResumeMeasure measures waits (DROVER_BENCH_WAITS=N; skipped
// without it), against an embedded etcd with fsync on and one worker of
// concurrency 64: the etcd bytes (keys and values) N step tasks parked
// WAITING add per task over the same tasks submitted, beside what the same
// tasks parked SLEEPING add, and the latency from a signal sent to the
// waiting step's next step started, one signal at a time (p50, p99, max).
// A measurement, not a timed test: it asserts no time bound.
func TestSignalResumeMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_WAITS"))
	if n <= 0 {
		t.Skip("set DROVER_BENCH_WAITS=N to measure N waiting tasks")
	}
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Stop()
	cli := s.Client(t)
	ctx := context.Background()
	c, err := queue.NewClient(cli, "bench")
	if err != nil {
		t.Fatal(err)
	}
	store, _ := task.NewStore(cli, "bench")
	var mu sync.Mutex
	started := map[string]chan struct{}{}
	resumed := func(ctx context.Context, s []byte) ([]byte, error) {
		mu.Lock()
		ch := started[queue.TaskIDOf(ctx)]
		mu.Unlock()
		if ch != nil {
			close(ch)
		}
		return s, nil
	}
	state := []byte(`{"plan":"delete 3 stale branches"}`)
	park := func(q string, end error) (perTask float64) {
		ts := make([]queue.Task, n)
		for i := range ts {
			ts[i] = queue.Task{ID: fmt.Sprintf("%s-%06d", q, i), Type: "agent"}
		}
		before, _ := storedBytes(t, cli, "/bench/")
		for from := 0; from < n; from += 10000 {
			if _, err := c.Submit(ctx, q, ts[from:min(from+10000, n)], nil); err != nil {
				t.Fatal(err)
			}
		}
		submitted, _ := storedBytes(t, cli, "/bench/")
		w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: "bench", Queue: q, Concurrency: 64})
		if err != nil {
			t.Fatal(err)
		}
		w.HandleAll(queue.Steps(store,
			task.Step{Name: "plan", Run: func(context.Context, []byte) ([]byte, error) { return state, end }},
			task.Step{Name: "act", Run: resumed}))
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = w.Run(rctx); close(done) }()
		t.Cleanup(func() { stop(); <-done; _ = w.Close(context.Background()) })
		waitUntil(t, "every task parked", func() bool {
			st, err := c.Stats(ctx, q)
			return err == nil && st.Waiting+st.Sleeping == int64(n)
		})
		parked, _ := storedBytes(t, cli, "/bench/")
		t.Logf("%s: submitted %.0f bytes a task; parked %.0f more a task", q, float64(submitted-before)/float64(n), float64(parked-submitted)/float64(n))
		return float64(parked-submitted) / float64(n)
	}
	sleeping := park("sleeps", task.Sleep(24*time.Hour))
	waiting := park("waits", task.WaitSignal("approval", 24*time.Hour))
	keys := keyspace.MustNew("bench")
	waitKeys, _ := storedBytes(t, cli, keys.QueueWait("waits"))
	t.Logf("parked WAITING: %.0f bytes a task over submitted (its wait key %.0f); SLEEPING: %.0f; waiting beyond sleeping: %.0f",
		waiting, float64(waitKeys)/float64(n), sleeping, waiting-sleeping)
	for _, id := range []string{"sleeps-000000", "waits-000000"} {
		rec, _ := storedBytes(t, cli, keys.TaskRecord(id))
		cp, _ := storedBytes(t, cli, keys.TaskCheckpoint(id))
		steps, _ := storedBytes(t, cli, keys.TaskSteps(id))
		t.Logf("%s: record %d bytes, checkpoint %d, step records %d", id, rec, cp, steps)
	}

	lat, send := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n {
		id := fmt.Sprintf("waits-%06d", i)
		ch := make(chan struct{})
		mu.Lock()
		started[id] = ch
		mu.Unlock()
		t0 := time.Now()
		if _, err := c.Signal(ctx, id, "approval", []byte(`{"approved":true}`), "r"); err != nil {
			t.Fatal(err)
		}
		send = append(send, time.Since(t0))
		select {
		case <-ch:
		case <-time.After(time.Minute):
			t.Fatalf("%s not resumed a minute after its signal", id)
		}
		lat = append(lat, time.Since(t0))
	}
	for _, d := range [][]time.Duration{lat, send} {
		slices.Sort(d)
	}
	pct := func(d []time.Duration, p float64) time.Duration {
		return d[min(len(d)-1, int(p*float64(len(d))))].Round(100 * time.Microsecond)
	}
	t.Logf("signal sent to next step started, %d signals one at a time: p50 %v, p90 %v, p99 %v, max %v (the Signal call alone: p50 %v, p99 %v)", n,
		pct(lat, 0.5), pct(lat, 0.9), pct(lat, 0.99), lat[len(lat)-1].Round(100*time.Microsecond), pct(send, 0.5), pct(send, 0.99))
}
