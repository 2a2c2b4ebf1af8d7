package queue_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestPauseIdempotent: pausing a paused queue and resuming a running one
// are not errors (Changed false); an unknown queue is ErrNoQueue and a bad
// name an input error; Stats and Paused say it.
func TestPauseIdempotent(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	ctx := context.Background()
	submitN(t, c, "p", 3, nil)
	for i, want := range []bool{true, false} {
		st, err := c.Pause(ctx, "p")
		if err != nil || !st.Paused || st.Changed != want || st.Since.IsZero() {
			t.Fatalf("pause %d: %+v %v", i, st, err)
		}
	}
	if st, err := c.Stats(ctx, "p"); err != nil || !st.Paused || st.Pending != 3 {
		t.Fatalf("stats while paused: %+v %v", st, err)
	}
	if qs, err := c.Queues(ctx); err != nil || len(qs) != 1 || !qs[0].Stats.Paused {
		t.Fatalf("queues while paused: %+v %v", qs, err)
	}
	for i, want := range []bool{true, false} {
		st, err := c.Resume(ctx, "p")
		if err != nil || st.Paused || st.Changed != want {
			t.Fatalf("resume %d: %+v %v", i, st, err)
		}
	}
	if st, err := c.Paused(ctx, "p"); err != nil || st.Paused {
		t.Fatalf("paused after resume: %+v %v", st, err)
	}
	for _, f := range []func(context.Context, string) (queue.PauseState, error){c.Pause, c.Resume} {
		if _, err := f(ctx, "nope"); !errors.Is(err, queue.ErrNoQueue) {
			t.Fatalf("unknown queue: %v", err)
		}
		var ie *drover.InputError
		if _, err := f(ctx, "bad/name"); !errors.As(err, &ie) {
			t.Fatalf("bad name: %v", err)
		}
	}
}

// claimLog records the tasks handlers started: their tokens (the
// revision their claim committed at).
type claimLog struct {
	mu     sync.Mutex
	tokens []int64
	at     []time.Time
}

func (l *claimLog) add(tok int64) {
	l.mu.Lock()
	l.tokens = append(l.tokens, tok)
	l.at = append(l.at, time.Now())
	l.mu.Unlock()
}

func (l *claimLog) after(rev int64) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, tok := range l.tokens {
		if tok > rev {
			n++
		}
	}
	return n
}

func (l *claimLog) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.tokens)
}

// pauseRev is the revision the pause key of q was written at.
func pauseRev(t *testing.T, cli *clientv3.Client, ns, q string) int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), "/"+ns+"/queues/"+q+"/paused")
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("pause key: %v %v", g, err)
	}
	return g.Kvs[0].ModRevision
}

// TestPauseStopsEveryClaimer: with two Go workers and an external claimer
// (the HTTP API's broker) running, a pause lets running tasks finish and
// be acknowledged, no claim commits after it (every token is older than
// the pause), submissions are accepted, the idle claimers make no claim
// transaction while paused, and the resume lets the queue drain.
func TestPauseStopsEveryClaimer(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q = "pz"
	submitN(t, c, q, 60, nil)
	var log claimLog
	release := make(chan struct{})
	var started atomic.Int64
	var runs sync.WaitGroup
	for range 2 {
		w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 3, Prefetch: 1})
		w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
			log.add(tk.Token)
			started.Add(1)
			<-release
			return nil, nil
		})
		runs.Go(func() { _ = w.Run(ctx) })
	}
	// The external claimer: long polls, acking at once once released.
	ext, extAcked := make(chan struct{}), atomic.Int64{}
	go func() {
		defer close(ext)
		l := grantLease(t, cli, 10*time.Second)
		for ctx.Err() == nil {
			ts, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "http", Max: 2, Wait: 2 * time.Second})
			if err != nil {
				return
			}
			for _, tk := range ts {
				log.add(tk.Token)
				select {
				case <-release:
				case <-ctx.Done():
					return
				}
				if _, err := c.Ack(ctx, queue.Held{Queue: q, ID: tk.ID, Token: tk.Token, Lease: l.ID()}, nil); err == nil {
					extAcked.Add(1)
				}
			}
		}
	}()
	waitFor(t, "tasks running on every worker", func() bool { return started.Load() >= 6 })
	if _, err := c.Pause(ctx, q); err != nil {
		t.Fatal(err)
	}
	rev := pauseRev(t, cli, ns, q)
	before := log.len()
	close(release) // the running tasks finish and are acknowledged
	waitFor(t, "running tasks acknowledged", func() bool {
		st, err := c.Stats(ctx, q)
		return err == nil && st.Running == 0 && st.Succeeded >= int64(before)
	})
	if res, err := c.Submit(ctx, q, tasksN("late", 20), nil); err != nil || res.Submitted != 20 {
		t.Fatalf("submit while paused: %+v %v", res, err)
	}
	// A window in which an unfenced worker would claim many: none may.
	claimTxns := claimTxnCount(t)
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if n := log.after(rev); n > 0 {
			t.Fatalf("%d claims committed after the pause", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if extra := claimTxnCount(t) - claimTxns; extra > 0 {
		t.Errorf("%d claim transactions while paused and idle", extra)
	}
	st, _ := c.Stats(ctx, q)
	if !st.Paused || st.Pending == 0 || st.Running != 0 {
		t.Fatalf("stats while paused: %+v", st)
	}
	if _, err := c.Resume(ctx, q); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the queue drains after the resume", func() bool {
		st, err := c.Stats(ctx, q)
		return err == nil && st.Unfinished() == 0 && st.Succeeded == 80
	})
	if log.after(rev) == 0 {
		t.Fatal("no claim after the resume")
	}
	cancel()
	runs.Wait()
	<-ext
}

// claimTxnCount is how many claim transactions this process made.
func claimTxnCount(t *testing.T) uint64 {
	t.Helper()
	return histCount(t, "drover_etcd_txn_duration_seconds", "op", "claim")
}

// histCount is the count of observations of histogram name whose label
// is value.
func histCount(t *testing.T, name, label, value string) uint64 {
	t.Helper()
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var n uint64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					n += m.GetHistogram().GetSampleCount()
				}
			}
		}
	}
	return n
}

// waitFor polls cond (a bounded loop of short waits) for up to 60 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for i := 0; i < 1200; i++ {
		if cond() {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out waiting: %s", what)
}

// TestPauseLatency measures, with 16 workers claiming short tasks, how
// many claims commit after a pause and how long after Pause returns the
// last claimed task starts (DROVER_PAUSE_BENCH=1; figures in
// docs/BENCHMARKS.md).
func TestPauseLatency(t *testing.T) {
	if os.Getenv("DROVER_PAUSE_BENCH") == "" {
		t.Skip("set DROVER_PAUSE_BENCH=1 to measure")
	}
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const q, workers, rounds = "lat", 16, 20
	var log claimLog
	var runs sync.WaitGroup
	for range workers {
		w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 4})
		w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
			log.add(tk.Token)
			time.Sleep(2 * time.Millisecond)
			return nil, nil
		})
		runs.Go(func() { _ = w.Run(ctx) })
	}
	var lags []time.Duration
	after := 0
	for r := range rounds {
		if _, err := c.Submit(ctx, q, tasksN(fmt.Sprintf("r%d", r), 2000), nil); err != nil {
			t.Fatal(err)
		}
		n0 := log.len()
		waitFor(t, "claims flowing", func() bool { return log.len() > n0+200 })
		if _, err := c.Pause(ctx, q); err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		rev := pauseRev(t, cli, ns, q)
		time.Sleep(time.Second)
		after += log.after(rev)
		log.mu.Lock()
		last := returned
		for i, tok := range log.tokens {
			if tok < rev && log.at[i].After(last) {
				last = log.at[i]
			}
		}
		log.mu.Unlock()
		lags = append(lags, last.Sub(returned))
		if _, err := c.Resume(ctx, q); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "drained", func() bool { st, err := c.Stats(ctx, q); return err == nil && st.Unfinished() == 0 })
	}
	slices.Sort(lags)
	t.Logf("%d workers, %d pauses: claims committed after a pause: %d; last task started after Pause returned: p50 %v, p99 %v, max %v",
		workers, rounds, after, lags[len(lags)/2], lags[len(lags)*99/100], lags[len(lags)-1])
	if after > 0 {
		t.Errorf("%d claims committed after a pause", after)
	}
	cancel()
	runs.Wait()
}

// Pausing a queue: it takes submissions, but no claim of its tasks
// commits until it is resumed; pausing twice is not an error.
func ExampleClient_Pause() {
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	c, _ := queue.NewClient(cli, fmt.Sprintf("example-pause-%d", time.Now().UnixNano()))
	defer c.Close(ctx)
	_, _ = c.Submit(ctx, "emails", []queue.Task{{ID: "welcome-1", Type: "welcome"}}, nil)
	st, _ := c.Pause(ctx, "emails")
	fmt.Println("paused:", st.Paused, "changed:", st.Changed)
	st, _ = c.Pause(ctx, "emails")
	fmt.Println("again: changed:", st.Changed)
	stats, _ := c.Stats(ctx, "emails")
	fmt.Println("stats: paused:", stats.Paused, "pending:", stats.Pending)
	st, _ = c.Resume(ctx, "emails")
	fmt.Println("resumed: paused:", st.Paused, "changed:", st.Changed)
	// Output:
	// paused: true changed: true
	// again: changed: false
	// stats: paused: true pending: 1
	// resumed: paused: false changed: true
}
