package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStreamBoundaryAfterClaimLoss: a handler that lost its claim (its
// worker's lease revoked) gets ErrFenced on its next emit, and the
// stream shows its events, the boundary, then the next attempt's, and
// none of the lost attempt's after the boundary.
func TestStreamBoundaryAfterClaimLoss(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	const q, id = "streams", "s-1"
	retries := 3
	if _, err := c.Submit(ctx, q, []queue.Task{{ID: id, Type: "talk", MaxRetries: &retries}}, nil); err != nil {
		t.Fatal(err)
	}
	cfg := queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 1, TTL: 5 * time.Second, BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond}
	wa := newWorker(t, srv.Client(t), cfg)
	emitting, fenced := make(chan struct{}), make(chan int, 1)
	wa.HandleAll(func(hctx context.Context, _ *queue.Task) ([]byte, error) {
		ectx := context.WithoutCancel(hctx) // emit on after the loss: the emit itself must be refused
		for n := 0; ; n++ {
			if err := stream.Emit(ectx, "log", fmt.Sprintf("a%d", n)); err != nil {
				if !errors.Is(err, stream.ErrFenced) {
					t.Errorf("emit after the claim's loss: %v, want ErrFenced", err)
				}
				fenced <- n
				return nil, err
			}
			if n == 3 {
				if err := stream.Flush(ectx); err != nil {
					t.Errorf("flush before the loss: %v", err)
				}
				close(emitting)
			}
			time.Sleep(time.Millisecond)
		}
	})
	runWorker(t, wa)
	<-emitting
	if _, err := cli.Revoke(ctx, wa.Lease().ID()); err != nil {
		t.Fatal(err)
	}
	stored := <-fenced
	wb := newWorker(t, srv.Client(t), cfg)
	wb.HandleAll(func(hctx context.Context, _ *queue.Task) ([]byte, error) {
		return []byte("ok"), stream.Emit(hctx, "log", "b0")
	})
	runWorker(t, wb)

	hub := stream.NewHub(cli, keyspace.MustNew(ns))
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []stream.Event
	for ev, err := range hub.Follow(fctx, id, 1) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	// attempt_started, attempt 1's events (at most those emitted before
	// the loss), attempt_lost, attempt_started, b0, attempt_ended, done.
	boundary := slices.IndexFunc(got, func(ev stream.Event) bool { return ev.Type == stream.AttemptLost })
	if boundary < 1 || boundary > stored+1 || len(got) != boundary+5 {
		t.Fatalf("boundary at %d of %d events, after %d emits of attempt 1: %+v", boundary+1, len(got), stored, got)
	}
	want := map[int]string{0: stream.AttemptStarted, boundary + 1: stream.AttemptStarted, boundary + 2: "log", boundary + 3: stream.AttemptEnded, boundary + 4: stream.Done}
	for i, ev := range got {
		if w, ok := want[i]; ok && ev.Type != w {
			t.Fatalf("event %d is %s, want %s: %+v", i+1, ev.Type, w, got)
		}
		if i > boundary && ev.Attempt == 1 {
			t.Fatalf("event %d of the lost attempt after the boundary: %+v", ev.Seq, ev)
		}
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.Seq)
		}
	}
	for _, ev := range got[boundary+3:] {
		if string(ev.Data) != `{"attempt":2,"outcome":"succeeded"}` {
			t.Fatalf("%s: %s", ev.Type, ev.Data)
		}
	}
}

// runWorker runs w until the test ends.
func runWorker(t *testing.T, w *queue.Worker) {
	t.Helper()
	rctx, stop := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	t.Cleanup(func() { stop(); <-ran; _ = w.Close(context.Background()) })
}

// TestTaskWithoutEventsHasNoStream: a first attempt that emits nothing
// writes nothing to etcd for its stream, not even its end.
func TestTaskWithoutEventsHasNoStream(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "quiet", []queue.Task{{ID: "q-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "quiet", Concurrency: 1})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return []byte("ok"), nil })
	runWorker(t, w)
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if _, err := c.Wait(wctx, "q-1"); err != nil {
		t.Fatal(err)
	}
	keys := keyspace.MustNew(ns)
	for _, prefix := range []string{keys.StreamChunks("q-1"), keys.StreamExpiries()} {
		r, err := cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err != nil || r.Count != 0 {
			t.Fatalf("%s: %d keys (%v), want none", prefix, r.Count, err)
		}
	}
}

// TestStepsEmitToTheirTaskStream: a step of queue.Steps emits through
// its context, and the task's stream ends with done.
func TestStepsEmitToTheirTaskStream(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "stepped", []queue.Task{{ID: "st-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "stepped", Concurrency: 1})
	step := func(name string) task.Step {
		return task.Step{Name: name, Run: func(ctx context.Context, s []byte) ([]byte, error) {
			return s, stream.Emit(ctx, "progress", name)
		}}
	}
	w.HandleAll(queue.Steps(store, step("one"), step("two")))
	runWorker(t, w)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var types []string
	for ev, err := range stream.NewHub(cli, keyspace.MustNew(ns)).Follow(fctx, "st-1", 1) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type+":"+string(ev.Data))
	}
	want := []string{stream.AttemptStarted, `progress:"one"`, `progress:"two"`, stream.AttemptEnded, stream.Done}
	if len(types) != len(want) || !strings.HasPrefix(types[0], want[0]) || types[1] != want[1] || types[2] != want[2] || !strings.HasPrefix(types[3], want[3]) || !strings.HasPrefix(types[4], want[4]) {
		t.Fatalf("events %v, want %v", types, want)
	}
}

// TestDoneIsStoredWithTheOutcome: a task's done is written in the
// transaction that stores its outcome (a worker that dies before it
// leaves a task that runs again, not followers that stopped, and no
// worker can die between the two), after the attempt's end, which
// comes before it in attempt_ended.
func TestDoneIsStoredWithTheOutcome(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	// The namespace's writes are watched live from before the submission:
	// a watch of the past would fail once another test compacts etcd.
	g, err := cli.Get(ctx, keys.Root()+"none")
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	writes := cli.Watch(wctx, keys.Root(), clientv3.WithPrefix(), clientv3.WithRev(g.Header.Revision+1))
	if _, err := c.Submit(ctx, "after", []queue.Task{{ID: "af-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "after", Concurrency: 1})
	w.HandleAll(func(hctx context.Context, _ *queue.Task) ([]byte, error) {
		return []byte("ok"), stream.Emit(hctx, "log", "x")
	})
	runWorker(t, w)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var types []string
	for ev, err := range stream.NewHub(cli, keys).Follow(fctx, "af-1", 1) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
	}
	if len(types) != 4 || types[2] != stream.AttemptEnded || types[3] != stream.Done {
		t.Fatalf("events %v, want attempt_started, log, attempt_ended, done", types)
	}
	// The namespace's writes in order: the attempt's end, then the
	// outcome (the run's outs key) and done in one revision.
	var order []string
	for resp := range writes {
		if err := resp.Err(); err != nil {
			t.Fatalf("watching the namespace's writes: %v", err)
		}
		for _, ev := range resp.Events {
			k, v, rev := string(ev.Kv.Key), string(ev.Kv.Value), ev.Kv.ModRevision
			switch {
			case strings.HasPrefix(k, keys.StreamChunks("af-1")) && strings.Contains(v, `"t":"attempt_ended"`):
				order = append(order, fmt.Sprintf("ended@%d", rev-g.Header.Revision))
			case strings.HasPrefix(k, keys.StreamChunks("af-1")) && strings.Contains(v, `"t":"done"`):
				order = append(order, fmt.Sprintf("done@%d", rev-g.Header.Revision))
				wcancel()
			case strings.HasPrefix(k, keys.Queue("after")+"outs/") && len(order) > 0:
				order = append(order, fmt.Sprintf("outcome@%d", rev-g.Header.Revision))
			}
		}
	}
	if len(order) != 3 || !strings.HasPrefix(order[0], "ended@") || order[1][len("outcome"):] != order[2][len("done"):] || order[0][len("ended"):] == order[2][len("done"):] {
		t.Fatalf("writes in order %v, want the attempt's end, then the outcome and done in one revision", order)
	}
}

// TestDoneOfARetriedTaskInItsRecordsTransaction: a task with a record
// of its own (retried) gets its done in the transaction of its record's
// end, which says so (StreamSettled): a follower that waits for a late
// done without end (SettleAfter an hour) sees it and ends.
func TestDoneOfARetriedTaskInItsRecordsTransaction(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	retries := 3
	if _, err := c.Submit(ctx, "rec", []queue.Task{{ID: "rd-1", Type: "x", MaxRetries: &retries}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "rec", Concurrency: 1, BackoffBase: time.Millisecond, BackoffMax: 2 * time.Millisecond})
	w.HandleAll(func(hctx context.Context, tk *queue.Task) ([]byte, error) {
		if err := stream.Emit(hctx, "log", tk.Attempt); err != nil || tk.Attempt > 1 {
			return []byte("ok"), err
		}
		return nil, errors.New("once more")
	})
	runWorker(t, w)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []stream.Event
	for ev, err := range stream.NewHub(cli, keys).Follow(fctx, "rd-1", 1, c.EndsStream("rd-1", time.Hour), stream.SettleAfter(time.Hour)) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if n := len(got); n != 7 || got[n-1].Type != stream.Done || string(got[n-1].Data) != `{"attempt":2,"outcome":"succeeded"}` {
		t.Fatalf("events %+v, want attempt 1's, attempt 2's, then done", got)
	}
	rec, err := cli.Get(ctx, keys.TaskRecord("rd-1"))
	if err != nil {
		t.Fatal(err)
	}
	chunks, err := cli.Get(ctx, keys.StreamChunks("rd-1"), clientv3.WithLastKey()...)
	if err != nil || len(rec.Kvs) != 1 || len(chunks.Kvs) != 1 {
		t.Fatalf("the record and the last chunk: %v", err)
	}
	if rec.Kvs[0].ModRevision != chunks.Kvs[0].ModRevision || !strings.Contains(string(rec.Kvs[0].Value), `"stream_settled":true`) {
		t.Fatalf("the record (revision %d) says %s; done's revision %d: want one transaction, settled", rec.Kvs[0].ModRevision, rec.Kvs[0].Value, chunks.Kvs[0].ModRevision)
	}
}

// TestCancelledRunningTaskGetsDone: cancelling a running task closes
// its stream with done (cancelled), after the attempt's events.
func TestCancelledRunningTaskGetsDone(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "cut", []queue.Task{{ID: "cut-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "cut", Concurrency: 1})
	emitted := make(chan error, 1)
	w.HandleAll(func(hctx context.Context, _ *queue.Task) ([]byte, error) {
		err := stream.Emit(hctx, "log", "x")
		if err == nil {
			err = stream.Flush(hctx)
		}
		emitted <- err
		<-hctx.Done()
		return nil, context.Cause(hctx)
	})
	runWorker(t, w)
	if err := <-emitted; err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, "cut-1"); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var got []stream.Event
	for ev, err := range stream.NewHub(cli, keyspace.MustNew(ns)).Follow(fctx, "cut-1", 1) {
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	if len(got) != 3 || got[2].Type != stream.Done || string(got[2].Data) != `{"attempt":1,"outcome":"cancelled"}` {
		t.Fatalf("events %+v, want attempt_started, log, done (cancelled)", got)
	}
}

// TestFollowerOfAnEndedTaskWithoutDoneEnds: a task cancelled while it
// waits to run again (a bulk cancel writes no done, and its record says
// none comes) ends its followers through EndsStream once they have every
// stored event, without waiting for a late done.
func TestFollowerOfAnEndedTaskWithoutDoneEnds(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	retries := 3
	if _, err := c.Submit(ctx, "again", []queue.Task{{ID: "ag-1", Type: "x", MaxRetries: &retries}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "again", Concurrency: 1, BackoffBase: time.Hour, BackoffMax: time.Hour})
	w.HandleAll(func(hctx context.Context, _ *queue.Task) ([]byte, error) {
		if err := stream.Emit(hctx, "log", "x"); err != nil {
			return nil, queue.Permanent(err)
		}
		return nil, errors.New("once more")
	})
	runWorker(t, w)
	keys := keyspace.MustNew(ns)
	hub := stream.NewHub(cli, keys)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	n := 0
	for ev, err := range hub.Follow(fctx, "ag-1", 1) { // until the attempt's end
		if err != nil {
			t.Fatal(err)
		}
		if n++; ev.Type == stream.AttemptEnded {
			break
		}
	}
	for {
		tk, err := c.Get(ctx, "ag-1")
		if err != nil {
			t.Fatal(err)
		}
		if tk.CurrentStatus == queue.Retrying {
			break
		}
		if fctx.Err() != nil {
			t.Fatalf("task is %s, want RETRYING", tk.CurrentStatus)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if k, err := c.CancelTasks(ctx, "again", queue.Retrying, []string{"ag-1"}, nil); err != nil || k != 1 {
		t.Fatalf("cancel: %d, %v", k, err)
	}
	got := 0 // at once: a bulk cancel settles the stream (no done comes), so no wait (an hour) for a late one
	for _, err := range hub.Follow(fctx, "ag-1", 1, c.EndsStream("ag-1", 0), stream.SettleAfter(time.Hour)) {
		if err != nil {
			t.Fatal(err)
		}
		got++
	}
	if fctx.Err() != nil || got != n {
		t.Fatalf("follower got %d events (timed out: %v), want the %d stored, then its end", got, fctx.Err() != nil, n)
	}
}

// TestWaitedStepTaskStreamEndsWithDone: a step task that waited for a
// signal (a wait costs no attempt) and whose resumed step emits nothing
// still ends its stream with done, and its first attempt's end says it
// waits.
func TestWaitedStepTaskStreamEndsWithDone(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Submit(ctx, "waited", []queue.Task{{ID: "wt-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "waited", Concurrency: 1})
	w.HandleAll(queue.Steps(store,
		task.Step{Name: "ask", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			if err := stream.Emit(ctx, "progress", "asked"); err != nil {
				return nil, err
			}
			return s, task.WaitSignal("go", 0)
		}},
		task.Step{Name: "quiet", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }},
	))
	runWorker(t, w)
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	waitUntil(t, "the task waits", func() bool {
		got, err := c.Get(ctx, "wt-1")
		return err == nil && got.CurrentStatus == queue.Waiting
	})
	if _, err := c.Signal(ctx, "wt-1", "go", nil, "k"); err != nil {
		t.Fatal(err)
	}
	var types []string
	for ev, err := range stream.NewHub(cli, keyspace.MustNew(ns)).Follow(fctx, "wt-1", 1) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type+":"+string(ev.Data))
	}
	if len(types) == 0 || !strings.HasPrefix(types[len(types)-1], stream.Done) {
		t.Fatalf("events %v: the stream does not end with done", types)
	}
	if !slices.ContainsFunc(types, func(s string) bool {
		return strings.HasPrefix(s, stream.AttemptEnded) && strings.Contains(s, `"waiting"`)
	}) {
		t.Fatalf("events %v: no attempt_ended that says the task waits", types)
	}
}

// openFence is a fence that always holds, for a test that writes a
// task's stream without a claim.
type openFence struct{}

func (openFence) Token() int64             { return 1 }
func (openFence) Compares() []clientv3.Cmp { return nil }
func (openFence) Err() error               { return nil }

// TestFollowerOfATaskEndedLongAgoEndsAtOnce: EndsStream knows when its
// task ended, so a follower of a task that ended, with no done, longer
// ago than the wait for a late done ends at its first check, whatever
// that wait (an hour here).
func TestFollowerOfATaskEndedLongAgoEndsAtOnce(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	if _, err := c.Submit(ctx, "long", []queue.Task{{ID: "lo-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	if k, err := c.CancelTasks(ctx, "long", queue.Pending, []string{"lo-1"}, nil); err != nil || k != 1 {
		t.Fatalf("cancel: %d, %v", k, err)
	}
	w := stream.NewWriter(cli, keys, stream.Limits{}, time.Millisecond)
	if _, _, err := w.Append(ctx, stream.Claim{Task: "lo-1", Attempt: 1, Fence: openFence{}}, []stream.Input{{Type: "log"}}); err != nil {
		t.Fatal(err)
	}
	// The cancel two hours ago.
	rec, err := cli.Get(ctx, keys.TaskRecord("lo-1"))
	if err != nil || len(rec.Kvs) != 1 {
		t.Fatalf("the task's record: %v %v", rec, err)
	}
	var r map[string]any
	if err := json.Unmarshal(rec.Kvs[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	trs, _ := r["transitions"].([]any)
	if len(trs) == 0 {
		t.Fatalf("the task's record has no transitions: %s", rec.Kvs[0].Value)
	}
	trs[len(trs)-1].(map[string]any)["at"] = time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(r)
	if _, err := cli.Put(ctx, keys.TaskRecord("lo-1"), string(b)); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var types []string
	for ev, err := range stream.NewHub(cli, keys).Follow(fctx, "lo-1", 1, c.EndsStream("lo-1", time.Hour), stream.SettleAfter(time.Hour)) {
		if err != nil {
			t.Fatal(err)
		}
		types = append(types, ev.Type)
	}
	if fctx.Err() != nil || strings.Join(types, " ") != "attempt_started log" {
		t.Fatalf("follower got %v (timed out: %v), want attempt_started log, then its end at once", types, fctx.Err() != nil)
	}
}

// TestRequeuedTaskIsNotStreamSettled: a dead task whose done went with
// its end says stream_settled; requeued from the dead-letter queue it runs
// again, so its record no longer says so.
func TestRequeuedTaskIsNotStreamSettled(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	ctx := context.Background()
	if _, err := c.Submit(ctx, "rq", []queue.Task{{ID: "rq-1", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, srv.Client(t), queue.WorkerConfig{Namespace: ns, Queue: "rq", Concurrency: 1})
	w.HandleAll(func(hctx context.Context, tk *queue.Task) ([]byte, error) {
		if err := stream.Emit(hctx, "log", tk.Attempt); err != nil {
			return nil, err
		}
		return nil, &queue.PermanentError{Err: errors.New("no")}
	})
	runWorker(t, w)
	if k := waitFinished(t, c, "rq-1"); k.CurrentStatus != queue.Dead || !k.StreamSettled {
		t.Fatalf("after the dead attempt: %+v; want DEAD, stream_settled", k)
	}
	_ = w.Close(ctx) // the requeued task is not to run again here
	if n, err := c.Requeue(ctx, "rq", []string{"rq-1"}, nil); err != nil || n != 1 {
		t.Fatalf("requeue: %d, %v", n, err)
	}
	if k, err := c.Get(ctx, "rq-1"); err != nil || k.CurrentStatus != queue.Pending || k.StreamSettled {
		t.Fatalf("requeued: %+v, %v; want PENDING, not stream_settled", k, err)
	}
}
