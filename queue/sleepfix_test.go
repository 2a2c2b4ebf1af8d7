package queue_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An exec step writes its sleep and its checkpoint commits; the worker is
// stopped before the outcome is written, so the task is handed back as
// attempt 1, with no SLEEPING transition. The next worker must still find
// the checkpoint: the command does not run step 1 again.
func TestExecSleepHandedBackKeepsCheckpoint(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "$DROVER_STEP" >> ` + log + `; if [ "$DROVER_STEP" = 1 ]; then echo 1h > "$DROVER_SLEEP_FILE"; fi; echo out$DROVER_STEP`
	exec := queue.ExecHandler([]string{"/bin/sh", "-c", script}, 0, time.Second, nil)
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "ex", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	a := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	queue.SetWorkerClock(a, clock.now)
	var first atomic.Bool
	a.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		out, err := exec(ctx, tk)
		if first.CompareAndSwap(false, true) {
			go func() { _ = a.StopAndCancel(context.Background()) }()
			<-ctx.Done() // the shutdown lands between the checkpoint and the outcome
		}
		return out, err
	})
	ran := make(chan struct{})
	go func() { _ = a.Run(context.Background()); close(ran) }()
	<-ran
	b := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	queue.SetWorkerClock(b, clock.now)
	b.HandleAll(exec)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, "the task to sleep", func() bool {
		got, err := c.Get(context.Background(), "ex")
		return err == nil && got.CurrentStatus == queue.Sleeping
	})
	b2, _ := os.ReadFile(log)
	if runs := strings.Fields(string(b2)); len(runs) != 1 {
		t.Fatalf("the exec command ran as steps %v: step 1, checkpointed, ran again", runs)
	}
}

// In a FIFO queue a task that leaves its segment goes back to shard 0,
// whether it sleeps or fails: a sleep reported for a claim the Client
// remembers must not go back to its hash shard.
func TestFIFOSleepReportGoesToShardZero(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if err := c.SetConfig(ctx, "ff", queue.Config{FIFO: true}); err != nil {
		t.Fatal(err)
	}
	submitN(t, c, "ff", 8, nil)
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "ff", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(ts) != 2 {
		t.Fatal(len(ts), err)
	}
	out, err := c.Report(ctx, []queue.Outcome{{Held: held("ff", ts[1], l), SleepUntil: time.Now().Add(time.Hour)}})
	if err != nil || out[0].Err != nil {
		t.Fatal(err, out)
	}
	hits, stale := queue.RememberedOutcomes(c)
	t.Logf("memory: %d hits %d stale; slept %s", hits, stale, ts[1].ID)
	out, err = c.Report(ctx, []queue.Outcome{{Held: held("ff", ts[0], l), Failed: true, Error: "x"}})
	if err != nil || out[0].Err != nil {
		t.Fatal(err, out)
	}
	ks := keyspace.MustNew(ns)
	for _, pre := range []string{ks.QueueSleep("ff"), ks.QueueRetry("ff")} {
		g, err := cli.Get(ctx, pre, clientv3.WithPrefix())
		if err != nil || len(g.Kvs) != 1 {
			t.Fatal(pre, err)
		}
		var rv struct{ P string }
		_ = json.Unmarshal(g.Kvs[0].Value, &rv)
		p, _ := ks.ParsePendingKey("ff", rv.P)
		t.Logf("%s: goes back to shard %d", pre, p.Shard)
		if p.Shard != 0 {
			t.Errorf("%s: FIFO task goes back to shard %d, want 0", pre, p.Shard)
		}
	}
}

// sleepingTransitions counts task id's SLEEPING transitions.
func sleepingTransitions(t *testing.T, c *queue.Client, id string) int {
	t.Helper()
	g, err := c.Get(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, tr := range g.Transitions {
		if tr.Status == queue.Sleeping {
			n++
		}
	}
	return n
}

// A mover whose clock is 2 s ahead of the claiming worker's moves a
// sleeping task back when the worker still sees 2 s of sleep: the worker
// waits them out and runs the next step, rather than parking the task
// again for the mover to move at once, in a loop for as long as the skew.
func TestSleepSkewWithinMarginRuns(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	var sc stepCounter
	steps := sc.steps(5 * time.Second)
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "sk", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	startSleepWorker(t, cli, ns, clock, steps) // its own mover's clock stands still
	waitUntil(t, "sleep", func() bool {
		g, err := c.Get(context.Background(), "sk")
		return err == nil && g.CurrentStatus == queue.Sleeping
	})
	clock.advance(3 * time.Second) // 2 s before the end on the worker's clock
	ahead := func() time.Time { return clock.now().Add(2 * time.Second) }
	moves := 0
	for i := 0; i < 2000; i++ {
		n, err := queue.MoveSleeps(context.Background(), c, "q", ahead)
		if err != nil {
			t.Fatal(err)
		}
		moves += n
		g, err := c.Get(context.Background(), "sk")
		if err == nil && g.CurrentStatus == queue.Succeeded {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if moves != 1 || sc.count("s2") != 1 || sc.count("s3") != 1 {
		t.Fatalf("moves %d, s2 ran %d, s3 ran %d; want 1 each", moves, sc.count("s2"), sc.count("s3"))
	}
	if n := sleepingTransitions(t, c, "sk"); n != 1 {
		t.Fatalf("%d SLEEPING transitions, want 1", n)
	}
}

// A mover far ahead of the claiming worker (more than task.SleepMargin)
// moves a sleeping task back early: the worker parks it again, no sooner
// than 30 s from its own now, adding nothing to its history, so the same
// mover does not move it again at once.
func TestSleepSkewBeyondMarginReparksOnce(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	var sc stepCounter
	steps := sc.steps(time.Hour)
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "sk", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	startSleepWorker(t, cli, ns, clock, steps)
	waitUntil(t, "sleep", func() bool {
		g, err := c.Get(context.Background(), "sk")
		return err == nil && g.CurrentStatus == queue.Sleeping
	})
	first, _ := c.Get(context.Background(), "sk")
	clock.advance(time.Hour - 20*time.Second) // 20 s before the end on the worker's clock
	ahead := func() time.Time { return clock.now().Add(20 * time.Second) }
	n, err := queue.MoveSleeps(context.Background(), c, "q", ahead)
	if err != nil || n != 1 {
		t.Fatal(n, err)
	}
	var again *queue.Task
	waitUntil(t, "the task to park again", func() bool {
		g, err := c.Get(context.Background(), "sk")
		again = g
		return err == nil && g.CurrentStatus == queue.Sleeping && !g.ScheduledAt.Equal(first.ScheduledAt)
	})
	if want := clock.now().Add(30 * time.Second); again.ScheduledAt.Before(want) {
		t.Fatalf("parked again until %s, want no sooner than %s", again.ScheduledAt, want)
	}
	if m, err := queue.MoveSleeps(context.Background(), c, "q", ahead); err != nil || m != 0 {
		t.Fatalf("moved again at once: %d %v", m, err)
	}
	if sc.count("s2") != 0 {
		t.Fatalf("s2 ran %d times", sc.count("s2"))
	}
	if n := sleepingTransitions(t, c, "sk"); n != 1 || len(again.Transitions) != len(first.Transitions) {
		t.Fatalf("%d SLEEPING transitions, history %d then %d: a re-park adds none", n, len(first.Transitions), len(again.Transitions))
	}
}

// A draining worker runs what is pending and returns, leaving a task
// that sleeps an hour SLEEPING, as it leaves one scheduled later.
func TestDrainDoesNotWaitForSleepingTasks(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	var sc stepCounter
	if _, err := c.Submit(ctx, "q", []queue.Task{{ID: "nap", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	stop := startSleepWorker(t, cli, ns, newStillClock(), sc.steps(time.Hour))
	waitUntil(t, "sleep", func() bool {
		g, err := c.Get(ctx, "nap")
		return err == nil && g.CurrentStatus == queue.Sleeping
	})
	stop()
	submitN(t, c, "q", 2, nil)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 2, Drain: true})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a guard against hanging only
		t.Fatal("a draining worker did not return with a task sleeping an hour")
	}
	if st, _ := c.Stats(ctx, "q"); st.Sleeping != 1 || st.Succeeded != 2 {
		t.Fatalf("stats after the drain %+v, want 1 sleeping and 2 succeeded", st)
	}
}

// An HTTP-only queue (no Worker moves its due indexes): a sleep reported
// for a claim, of a task with a record of its own or one in a segment, is
// moved back when it falls due by the claim that waits, not a minute
// later when that claim's wait ends.
func TestExternalSleepResumesOnTime(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	for _, n := range []int{1, 4} {
		q := "nap-" + strconv.Itoa(n)
		if n == 1 {
			if _, err := c.Submit(ctx, q, []queue.Task{{ID: "n1", Type: "t"}}, nil); err != nil {
				t.Fatal(err)
			}
		} else {
			submitN(t, c, q, n, nil)
		}
		l := grantLease(t, cli, 120*time.Second)
		ts, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "w", Max: n})
		if err != nil || len(ts) != n {
			t.Fatal(len(ts), err)
		}
		os := []queue.Outcome{{Held: held(q, ts[0], l), SleepUntil: time.Now().Add(300 * time.Millisecond)}}
		for _, tk := range ts[1:] {
			os = append(os, queue.Outcome{Held: held(q, tk, l)})
		}
		out, err := c.Report(ctx, os)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range out {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
		}
		done := make(chan []*queue.Task, 1)
		go func() {
			got, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: l, Worker: "w", Max: 1, Wait: time.Minute})
			if err != nil {
				t.Error(err)
			}
			done <- got
		}()
		select {
		case got := <-done:
			if len(got) != 1 || got[0].ID != ts[0].ID {
				t.Fatalf("%s: the waiting claim got %d tasks", q, len(got))
			}
		case <-time.After(45 * time.Second):
			t.Fatalf("%s: the waiting claim slept through the sleep's end", q)
		}
	}
}

// An exec step's sleep file is read only when it is a regular file of
// at most 1 KiB: a link (to a device, a huge file) or a padded file ends
// the task as a permanent failure that names the rule, not a sleep.
func TestExecSleepFileBounded(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	if err := os.WriteFile(target, []byte("1h\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	scripts := map[string]string{
		"link":   `ln -s ` + target + ` "$DROVER_SLEEP_FILE"; echo out`,
		"padded": `head -c 2000 /dev/zero | tr '\0' ' ' > "$DROVER_SLEEP_FILE"; echo 1h >> "$DROVER_SLEEP_FILE"; echo out`,
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 2})
	zero := 0
	for name, script := range scripts {
		w.Handle(name, queue.ExecHandler([]string{"/bin/sh", "-c", script}, 0, time.Second, nil))
		if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: name, Type: name, MaxRetries: &zero}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	for name, want := range map[string]string{"link": "must be a regular file", "padded": "at most 1024 bytes"} {
		var got *queue.Task
		waitUntil(t, name+" to end", func() bool {
			g, err := c.Get(context.Background(), name)
			got = g
			return err == nil && (g.CurrentStatus == queue.Dead || g.CurrentStatus == queue.Sleeping || g.CurrentStatus == queue.Succeeded)
		})
		if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, want) {
			t.Errorf("%s: %s, %q; want DEAD saying %q", name, got.CurrentStatus, got.LastError, want)
		}
	}
}

// Deleting a queue purges its sleeping and retrying tasks before its
// pending ones: a sleep that falls due while the queue is deleted (moved
// here once the purge has deleted two tasks) cannot leave a PENDING task
// behind.
func TestDeleteQueuePurgesSleepingFirst(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "dq", 3, nil)
	l := grantLease(t, cli, 120*time.Second)
	ts, err := c.Claim(ctx, "dq", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(ts) != 2 {
		t.Fatal(len(ts), err)
	}
	out, err := c.Report(ctx, []queue.Outcome{{Held: held("dq", ts[0], l), SleepUntil: time.Now().Add(time.Hour)},
		{Held: held("dq", ts[1], l), Failed: true, Error: "again"}})
	if err != nil || out[0].Err != nil || out[1].Err != nil {
		t.Fatal(err, out)
	}
	if st, _ := c.Stats(ctx, "dq"); st.Pending != 1 || st.Retrying != 1 || st.Sleeping != 1 {
		t.Fatalf("stats %+v, want one pending, retrying and sleeping", st)
	}
	later := func() time.Time { return time.Now().Add(2 * time.Hour) }
	moved := false
	if _, err := c.DeleteQueue(ctx, "dq", func(done int) {
		if !moved && done >= 2 {
			moved = true
			if _, err := queue.MoveSleeps(ctx, c, "dq", later); err != nil {
				t.Error(err)
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	for _, tk := range ts {
		if g, err := c.Get(ctx, tk.ID); err == nil {
			t.Errorf("task %s left %s after its queue was deleted", tk.ID, g.CurrentStatus)
		}
	}
}
