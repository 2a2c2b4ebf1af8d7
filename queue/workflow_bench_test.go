package queue_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestWorkflowMeasure measures workflows against an embedded etcd with
// fsync on and one worker of concurrency 64 (skipped without its
// variables); a measurement, not a timed test: it asserts no time bound.
//
// DROVER_BENCH_WORKFLOWS=N: N step tasks of 3 no-op steps, one at a time,
// each from its submission to its completion as a client sees it
// (submitAndWatch): p50, p90, p99, max.
//
// DROVER_BENCH_PARKED=N: N step tasks parked WAITING for a signal; the
// etcd bytes (keys and values) they add per task over the same tasks
// submitted, where they are (record, checkpoint, step records, wait key,
// signals, children), the bytes the wait adds over the task itself (its
// wait key, its record's waiting_for and its WAITING transition), and the
// process's CPU (the embedded etcd, the worker and the test: the server of
// this run) and heap over 60 s while they wait.
// DROVER_BENCH_JSON_WAIT_VALUES=1 writes the wait keys' values in the JSON
// form parks wrote before their short form (see queue's shortWaitValues).
func TestWorkflowMeasure(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_WORKFLOWS"))
	parked, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_PARKED"))
	if n <= 0 && parked <= 0 {
		t.Skip("set DROVER_BENCH_WORKFLOWS=N or DROVER_BENCH_PARKED=N")
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
	noop := func(_ context.Context, s []byte) ([]byte, error) { return s, nil }
	state := []byte(`{"plan":"delete 3 stale branches"}`)
	start := func(q string, steps ...task.Step) {
		w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: "bench", Queue: q, Concurrency: 64})
		if err != nil {
			t.Fatal(err)
		}
		w.HandleAll(queue.Steps(store, steps...))
		rctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { _ = w.Run(rctx); close(done) }()
		t.Cleanup(func() { stop(); <-done; _ = w.Close(context.Background()) })
	}
	if n > 0 {
		start("flows", task.Step{Name: "a", Run: noop}, task.Step{Name: "b", Run: noop}, task.Step{Name: "c", Run: noop})
		lat := make([]time.Duration, 0, n)
		for i := range n {
			id := fmt.Sprintf("flow-%06d", i)
			lat = append(lat, submitAndWatch(t, c, cli, id, state))
		}
		slices.Sort(lat)
		pct := func(p float64) time.Duration {
			return lat[min(len(lat)-1, int(p*float64(len(lat))))].Round(100 * time.Microsecond)
		}
		t.Logf("3-step workflow of no-op steps, submission to completion, %d one at a time: p50 %v, p90 %v, p99 %v, max %v",
			n, pct(0.5), pct(0.9), pct(0.99), lat[len(lat)-1].Round(100*time.Microsecond))
	}
	if parked > 0 {
		if os.Getenv("DROVER_BENCH_JSON_WAIT_VALUES") != "" {
			defer queue.SetShortWaitValues(false)()
		}
		measureParked(t, c, s, store, start, state, parked)
	}
}

// submitAndWatch submits task id of 3 steps to queue "flows" and returns
// how long it took to be SUCCEEDED, as a client sees it: a watch of the
// namespace, open before the submission, and a read of the task after
// each batch of its events. (Client.Wait watches from the revision of its
// first read: etcd delivers such a watch's events from its loop that
// catches up watchers every 100 ms, which would add up to 100 ms here.)
func submitAndWatch(t *testing.T, c *queue.Client, cli *clientv3.Client, id string, state []byte) time.Duration {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wch := cli.Watch(ctx, "/bench/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	<-wch // created
	t0 := time.Now()
	if _, err := c.Submit(ctx, "flows", []queue.Task{{ID: id, Type: "agent", Parameters: state}}, nil); err != nil {
		t.Fatal(err)
	}
	for range wch {
		if got, err := c.Get(ctx, id); err == nil && got.CurrentStatus == queue.Succeeded {
			return time.Since(t0)
		}
	}
	t.Fatalf("%s not SUCCEEDED within a minute", id)
	return 0
}

// measureParked is TestWorkflowMeasure's DROVER_BENCH_PARKED part.
func measureParked(t *testing.T, c *queue.Client, s *etcdtest.Server, store *task.Store, start func(string, ...task.Step), state []byte, n int) {
	ctx := context.Background()
	cli := s.Client(t)
	ts := make([]queue.Task, n)
	for i := range ts {
		ts[i] = queue.Task{ID: fmt.Sprintf("wf-%06d", i), Type: "agent"}
	}
	before, _ := storedBytes(t, cli, "/bench/")
	for from := 0; from < n; from += 10000 {
		if _, err := c.Submit(ctx, "parked", ts[from:min(from+10000, n)], nil); err != nil {
			t.Fatal(err)
		}
	}
	submitted, _ := storedBytes(t, cli, "/bench/")
	start("parked",
		task.Step{Name: "plan", Run: func(context.Context, []byte) ([]byte, error) { return state, task.WaitSignal("approval", 24*time.Hour) }},
		task.Step{Name: "act", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }})
	began, logged := time.Now(), time.Now()
	for {
		st, err := c.Stats(ctx, "parked")
		if err == nil && st.Waiting == int64(n) {
			break
		}
		if time.Since(began) > 20*time.Minute {
			t.Fatalf("not every task parked in 20 minutes: %+v (%v)", st, err)
		}
		if time.Since(logged) > time.Minute {
			logged = time.Now()
			t.Logf("%d parked so far", st.Waiting)
		}
		time.Sleep(time.Second)
	}
	t.Logf("%d tasks parked in %v", n, time.Since(began).Round(time.Second))
	all, _ := storedBytes(t, cli, "/bench/")
	keys := keyspace.MustNew("bench")
	per := func(b int64) float64 { return float64(b) / float64(n) }
	var rec, cp, steps, sigs, kids, waitKeys int64
	for i := range n {
		id := ts[i].ID
		if i%max(1, n/1000) != 0 { // a sample of 1,000 tasks
			continue
		}
		b, _ := storedBytes(t, cli, keys.TaskRecord(id))
		rec += b
		b, _ = storedBytes(t, cli, keys.TaskCheckpoint(id))
		cp += b
		b, _ = storedBytes(t, cli, keys.TaskSteps(id))
		steps += b
		b, _ = storedBytes(t, cli, keys.TaskSignals(id))
		sigs += b
		b, _ = storedBytes(t, cli, keys.TaskChildren(id))
		kids += b
	}
	sample := float64((n + max(1, n/1000) - 1) / max(1, n/1000))
	waitKeys, _ = storedBytes(t, cli, keys.QueueWait("parked"))
	t.Logf("%d parked WAITING: %.0f bytes a task in all over submitted (submitted: %.0f a task); of which record %.0f, checkpoint %.0f, step records %.0f, signals %.0f, children %.0f, wait key %.0f",
		n, per(all-submitted), per(submitted-before), float64(rec)/sample, float64(cp)/sample, float64(steps)/sample, float64(sigs)/sample, float64(kids)/sample, per(waitKeys))
	one, err := cli.Get(ctx, keys.TaskRecord(ts[0].ID))
	if err != nil || len(one.Kvs) == 0 {
		t.Fatalf("record of %s: %v", ts[0].ID, err)
	}
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(one.Kvs[0].Value, &fields)
	var trs []json.RawMessage
	_ = json.Unmarshal(fields["transitions"], &trs)
	waitTr := 0
	for _, tr := range trs {
		if json.Valid(tr) && slices.Contains([]string{"WAITING"}, statusOf(tr)) {
			waitTr += len(tr) + 1
		}
	}
	marginal := per(waitKeys) + float64(len(fields["waiting_for"])+len(`,"waiting_for":`)+waitTr)
	t.Logf("the wait's own bytes over the task: %.0f (wait key %.0f, waiting_for %d, its WAITING transition %d); record %s", marginal, per(waitKeys), len(fields["waiting_for"]), waitTr, one.Kvs[0].Value)

	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	w0 := time.Now()
	time.Sleep(60 * time.Second)
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st, _ := s.Client(t).Status(ctx, s.Endpoints()[0])
	var dbSize int64
	if st != nil {
		dbSize = st.DbSize
	}
	t.Logf("while %d wait, over %v: CPU %v (%.1f%% of one core); heap in use %d MiB, process max RSS %d MiB, etcd db %d MiB",
		n, time.Since(w0).Round(time.Second), cpu.Round(time.Millisecond), 100*cpu.Seconds()/time.Since(w0).Seconds(), ms.HeapInuse>>20, ru1.Maxrss>>10, dbSize>>20)
}

// statusOf is the status of a transition as JSON.
func statusOf(tr json.RawMessage) string {
	var v struct {
		Status string `json:"status"`
	}
	_ = json.Unmarshal(tr, &v)
	return v.Status
}
