package qstats

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// workload is a known mix of outcomes: ok tasks succeed, dead ones fail
// for good, flaky ones fail once then succeed, held ones are deferred once
// by a gate then succeed.
type workload struct{ ok, dead, flaky, held int }

// want is what the history must count for w.
func (w workload) want() Counts {
	return Counts{Processed: int64(w.ok + w.flaky + w.held), Failed: int64(w.dead), Retried: int64(w.flaky),
		Deferred: int64(w.held), Started: int64(w.ok + w.dead + w.flaky + w.held)}
}

// holdOnce defers each task of type "held" once.
type holdOnce struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (g *holdOnce) Admit(_ context.Context, t *queue.Task) (func(error), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.Type == "held" && !g.seen[t.ID] {
		g.seen[t.ID] = true
		return nil, &queue.DeferError{Reason: "test-quota", After: 10 * time.Millisecond}
	}
	return func(error) {}, nil
}

// run submits w's tasks to queue q (ids prefixed with tag) and runs a
// worker until the queue drains.
func (w workload) run(t *testing.T, cli *clientv3.Client, ns, q, tag string) {
	t.Helper()
	ctx := context.Background()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	var tasks []queue.Task
	add := func(kind string, n int) {
		for i := range n {
			tasks = append(tasks, queue.Task{ID: fmt.Sprintf("%s-%s-%d", tag, kind, i), Type: kind,
				BackoffBase: queue.Duration(10 * time.Millisecond), BackoffMax: queue.Duration(20 * time.Millisecond)})
		}
	}
	add("ok", w.ok)
	add("dead", w.dead)
	add("flaky", w.flaky)
	add("held", w.held)
	if _, err := c.Submit(ctx, q, tasks, nil); err != nil {
		t.Fatal(err)
	}
	wk, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 8, Drain: true,
		Gates: []queue.Gate{&holdOnce{seen: map[string]bool{}}}})
	if err != nil {
		t.Fatal(err)
	}
	defer wk.Close(ctx)
	ok := func(context.Context, *queue.Task) ([]byte, error) { return []byte("done"), nil }
	wk.Handle("ok", ok)
	wk.Handle("held", ok)
	wk.Handle("dead", func(context.Context, *queue.Task) ([]byte, error) {
		return nil, queue.Permanent(errors.New("bad input"))
	})
	wk.Handle("flaky", func(_ context.Context, t *queue.Task) ([]byte, error) {
		if t.Attempt == 1 {
			return nil, errors.New("try again")
		}
		return []byte("done"), nil
	})
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := wk.Run(rctx); err != nil {
		t.Fatal(err)
	}
}

func startRecorder(t *testing.T, cli *clientv3.Client, ns string, m bool) *Recorder {
	t.Helper()
	r, err := NewRecorder(Config{Client: cli, Namespace: ns, Manual: true, Metrics: m})
	if err != nil {
		t.Fatal(err)
	}
	r.Start(context.Background())
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	select {
	case <-r.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("recorder not ready")
	}
	return r
}

// startRecorderAt starts a recorder whose clock says now.
func startRecorderAt(t *testing.T, cli *clientv3.Client, ns string, now time.Time) *Recorder {
	t.Helper()
	return startWith(t, Config{Client: cli, Namespace: ns, Manual: true, Now: func() time.Time { return now }})
}

// waitCounted waits until r counted want for q: the events reach a watch
// when they do, so the test waits for the count, not for a time.
func waitCounted(t *testing.T, r *Recorder, q string, want Counts) {
	t.Helper()
	if !etcdtest.Eventually(30*time.Second, func() bool { return r.Unclosed(q) == want }) {
		t.Fatalf("counted %+v, want %+v", r.Unclosed(q), want)
	}
}

func minuteOf(h *History, m time.Time) Minute {
	for _, mi := range h.Minutes {
		if mi.At.Equal(m) {
			return mi
		}
	}
	return Minute{}
}

var t0 = time.Date(2026, 11, 28, 12, 0, 0, 0, time.UTC)

func TestHistoryCountsOutcomesExactly(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const q = "mix"
	r := startRecorder(t, cli, ns, true)
	counters := map[string]prometheus.Counter{"processed": metrics.QueueProcessed.WithLabelValues(q), "failed": metrics.QueueFailed.WithLabelValues(q),
		"retried": metrics.QueueRetried.WithLabelValues(q), "deferred": metrics.QueueDeferred.WithLabelValues(q)}
	before := map[string]float64{}
	for k, c := range counters {
		before[k] = testutil.ToFloat64(c)
	}
	w := workload{ok: 5, dead: 3, flaky: 4, held: 2}
	w.run(t, cli, ns, q, "a")
	waitCounted(t, r, q, w.want())
	if closed, err := r.CloseMinute(context.Background(), t0); err != nil || !closed {
		t.Fatalf("close: %v, %v", closed, err)
	}
	h, err := Read(context.Background(), cli, ns, q, Hour, t0)
	if err != nil {
		t.Fatal(err)
	}
	if got := minuteOf(h, t0).Counts; got != w.want() {
		t.Errorf("minute %v: %+v, want %+v", t0, got, w.want())
	}
	if h.Total != w.want() || len(h.Minutes) != 60 || !h.ClosedThrough.Equal(t0) {
		t.Errorf("total %+v, %d minutes, closed through %v", h.Total, len(h.Minutes), h.ClosedThrough)
	}
	if h.Latency.Count() != w.want().Started {
		t.Errorf("latency samples %d, want %d", h.Latency.Count(), w.want().Started)
	}
	for name, want := range map[string]int64{"processed": w.want().Processed, "failed": w.want().Failed,
		"retried": w.want().Retried, "deferred": w.want().Deferred} {
		if moved := testutil.ToFloat64(counters[name]) - before[name]; int64(moved) != want {
			t.Errorf("metric %s moved by %v, want %d", name, moved, want)
		}
	}
	if n := testutil.CollectAndCount(metrics.QueueStartLatency, "drover_queue_start_latency_seconds"); n == 0 {
		t.Error("no latency histogram exported")
	}
	// A minute already closed is not closed again.
	if closed, _ := r.CloseMinute(context.Background(), t0); closed {
		t.Error("closed a minute twice")
	}
}

// Two servers on one etcd: each minute is written by one of them, counts
// each event once, and both read the same history.
func TestHistoryTwoServersAgree(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const q = "shared"
	a, b := startRecorder(t, cli, ns, false), startRecorder(t, srv.Client(t), ns, false)
	w1, w2 := workload{ok: 6, dead: 1}, workload{ok: 2, flaky: 3, held: 1}
	w1.run(t, cli, ns, q, "one")
	waitCounted(t, a, q, w1.want())
	waitCounted(t, b, q, w1.want())
	if closed, err := a.CloseMinute(context.Background(), t0); err != nil || !closed {
		t.Fatalf("a closes: %v, %v", closed, err)
	}
	waitCounted(t, b, q, Counts{}) // b saw the mark: what a closed is not b's to count
	w2.run(t, cli, ns, q, "two")
	waitCounted(t, a, q, w2.want())
	waitCounted(t, b, q, w2.want())
	m1 := t0.Add(time.Minute)
	if closed, err := b.CloseMinute(context.Background(), m1); err != nil || !closed {
		t.Fatalf("b closes: %v, %v", closed, err)
	}
	waitCounted(t, a, q, Counts{})
	if closed, _ := a.CloseMinute(context.Background(), m1); closed {
		t.Error("a closed the minute b closed")
	}
	ha, err := Read(context.Background(), cli, ns, q, Day, m1)
	if err != nil {
		t.Fatal(err)
	}
	hb, err := Read(context.Background(), srv.Client(t), ns, q, Day, m1)
	if err != nil {
		t.Fatal(err)
	}
	if minuteOf(ha, t0).Counts != w1.want() || minuteOf(ha, m1).Counts != w2.want() || len(ha.Minutes) != 1440 {
		t.Errorf("minutes %+v and %+v, want %+v and %+v", minuteOf(ha, t0).Counts, minuteOf(ha, m1).Counts, w1.want(), w2.want())
	}
	if fmt.Sprint(ha) != fmt.Sprint(hb) {
		t.Error("the two servers read different histories")
	}
}

// A restarted server goes on from the mark: what happened while it was
// down, and what it had counted but not closed, is counted once.
func TestHistorySurvivesRestart(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const q = "restart"
	r := startRecorder(t, cli, ns, false)
	w1, w2, w3 := workload{ok: 3}, workload{ok: 2, dead: 2}, workload{flaky: 2, held: 1}
	w1.run(t, cli, ns, q, "one")
	waitCounted(t, r, q, w1.want())
	if closed, err := r.CloseMinute(context.Background(), t0); err != nil || !closed {
		t.Fatalf("close: %v, %v", closed, err)
	}
	w2.run(t, cli, ns, q, "two")
	waitCounted(t, r, q, w2.want()) // counted, not closed: lost with the process
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	w3.run(t, cli, ns, q, "three") // while no server counts
	r2 := startRecorderAt(t, cli, ns, t0.Add(2*time.Minute))
	want := w2.want()
	want.add(w3.want())
	waitCounted(t, r2, q, want)
	m1 := t0.Add(time.Minute)
	if closed, err := r2.CloseMinute(context.Background(), m1); err != nil || !closed {
		t.Fatalf("close after restart: %v, %v", closed, err)
	}
	h, err := Read(context.Background(), cli, ns, q, Hour, m1)
	if err != nil {
		t.Fatal(err)
	}
	if minuteOf(h, t0).Counts != w1.want() || minuteOf(h, m1).Counts != want || minuteOf(h, m1).Gap {
		t.Errorf("minutes %+v, %+v, want %+v, %+v", minuteOf(h, t0), minuteOf(h, m1), w1.want(), want)
	}
}

// A server that starts after the store compacted the revisions since the
// mark cannot count what they held: its first minute says so.
func TestHistoryGapAfterCompaction(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const q = "gap"
	r := startRecorder(t, cli, ns, false)
	w1, w2, w3 := workload{ok: 2}, workload{ok: 3}, workload{ok: 4, dead: 1}
	w1.run(t, cli, ns, q, "one")
	waitCounted(t, r, q, w1.want())
	if closed, err := r.CloseMinute(context.Background(), t0); err != nil || !closed {
		t.Fatalf("close: %v, %v", closed, err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	w2.run(t, cli, ns, q, "two")                                    // lost: compacted before any server counted it
	resp, err := cli.Put(context.Background(), "/"+ns+"/other", "") // the compaction keeps this revision: not a queue's
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(context.Background(), resp.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
	r2 := startRecorderAt(t, cli, ns, t0.Add(2*time.Minute))
	w3.run(t, cli, ns, q, "three")
	waitCounted(t, r2, q, w3.want())
	m1 := t0.Add(time.Minute)
	if closed, err := r2.CloseMinute(context.Background(), m1); err != nil || !closed {
		t.Fatalf("close after compaction: %v, %v", closed, err)
	}
	h, err := Read(context.Background(), cli, ns, q, Hour, m1)
	if err != nil {
		t.Fatal(err)
	}
	if got := minuteOf(h, m1); !got.Gap || got.Counts != w3.want() {
		t.Errorf("minute after compaction: gap %v, counts %+v; want a gap and %+v", got.Gap, got.Counts, w3.want())
	}
	if minuteOf(h, t0).Gap {
		t.Error("the minute before says gap")
	}
}

// A server that starts long after the last minute closed (no server ran
// for more than staleMark) counts from its start, and its first minute
// says gap, rather than putting everything since into one minute.
func TestHistoryStaleMarkStartsNow(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	const q = "stale"
	r := startRecorder(t, cli, ns, false)
	w1, w2, w3 := workload{ok: 2}, workload{ok: 3}, workload{ok: 1, dead: 1}
	w1.run(t, cli, ns, q, "one")
	waitCounted(t, r, q, w1.want())
	if closed, err := r.CloseMinute(context.Background(), t0); err != nil || !closed {
		t.Fatalf("close: %v, %v", closed, err)
	}
	if err := r.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	w2.run(t, cli, ns, q, "two") // while no server runs, for ten minutes
	later := t0.Add(10 * time.Minute)
	r2 := startRecorderAt(t, cli, ns, later)
	w3.run(t, cli, ns, q, "three")
	waitCounted(t, r2, q, w3.want())
	if closed, err := r2.CloseMinute(context.Background(), later); err != nil || !closed {
		t.Fatalf("close: %v, %v", closed, err)
	}
	h, err := Read(context.Background(), cli, ns, q, Hour, later)
	if err != nil {
		t.Fatal(err)
	}
	if got := minuteOf(h, later); !got.Gap || got.Counts != w3.want() {
		t.Errorf("first minute after ten minutes down: gap %v, counts %+v; want a gap and %+v", got.Gap, got.Counts, w3.want())
	}
}
