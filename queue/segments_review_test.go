package queue

// Regression tests of a review of the segment layout (docs/queue.md, "Where
// a task's state lives"). They use the package's internals (a worker's
// claims and outcome writer without Run, a claim's fence, the state of a
// segment as read), so they are internal tests; the package's shared etcd
// lives in the external test package, so each test starts an embedded etcd
// of its own.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const reviewQueue = "jobs"

// reviewEnv is an embedded etcd of the test's own, with a client, a
// namespace and a queue client of it.
type reviewEnv struct {
	srv *etcdtest.Server
	cli *clientv3.Client
	ns  string
	c   *Client
}

func newReviewEnv(t *testing.T) *reviewEnv {
	t.Helper()
	s, cli := etcdtest.StartOwn(t)
	return &reviewEnv{srv: s, cli: cli}
}

// space returns a fresh namespace of e's server for test t, with e.ns and
// e.c set to it.
func (e *reviewEnv) space(t *testing.T) *reviewEnv {
	t.Helper()
	ns := etcdtest.Namespace(t)
	c, err := NewClient(e.cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	return &reviewEnv{srv: e.srv, cli: e.cli, ns: ns, c: c}
}

// worker returns a worker of queue jobs (not running), whose lease is
// revoked when the test ends.
func (e *reviewEnv) worker(t *testing.T, cfg WorkerConfig) *Worker {
	t.Helper()
	cfg.Namespace, cfg.Queue = e.ns, reviewQueue
	w, err := NewWorker(context.Background(), e.cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	return w
}

// submitSegment submits n tasks named prefix-000... in one request (one
// segment) and returns the segment's name.
func (e *reviewEnv) submitSegment(t *testing.T, prefix string, n int) string {
	t.Helper()
	ctx := context.Background()
	ts := make([]Task, n)
	for i := range ts {
		ts[i] = Task{ID: fmt.Sprintf("%s-%03d", prefix, i), Type: "work", Parameters: []byte(fmt.Sprintf(`{"n":%d}`, i))}
	}
	res, err := e.c.Submit(ctx, reviewQueue, ts, nil)
	if err != nil || res.Submitted != n {
		t.Fatalf("submit %d tasks: %+v, %v", n, res, err)
	}
	first, err := e.c.Get(ctx, ts[0].ID)
	if err != nil || first.seg == nil {
		t.Fatalf("get %s: %+v, %v", ts[0].ID, first, err)
	}
	return first.seg.seg
}

// claimRun claims up to n slots of segment seg with w, in one run, and
// requires that it took n.
func claimRun(t *testing.T, w *Worker, seg string, n int) []*claim {
	t.Helper()
	claims, _, err := w.sched.claimSegment(context.Background(), 0, seg, n)
	if err != nil || len(claims) != n {
		t.Fatalf("claim %d slots of segment %s: got %d, %v", n, seg, len(claims), err)
	}
	return claims
}

// stats returns queue jobs' counts.
func (e *reviewEnv) stats(t *testing.T) Stats {
	t.Helper()
	st, err := e.c.Stats(context.Background(), reviewQueue)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// statuses returns the status of each of claims' tasks, by id.
func (e *reviewEnv) statuses(t *testing.T, claims []*claim) map[string]Status {
	t.Helper()
	ids := make([]string, len(claims))
	for i, cl := range claims {
		ids[i] = cl.task.ID
	}
	ts, err := e.c.getMany(context.Background(), ids)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Status{}
	for _, tk := range ts {
		out[tk.ID] = tk.CurrentStatus
	}
	return out
}

// requireNothingFree requires that no slot of segment seg (of n tasks) is
// free to claim, as its state reads now and as another worker's claim sees
// it: nothing of it will run a second time.
func (e *reviewEnv) requireNothingFree(t *testing.T, seg string, n int) {
	t.Helper()
	st, err := e.c.readState(context.Background(), reviewQueue, seg)
	if err != nil {
		t.Fatal(err)
	}
	if st.n == 0 {
		st.n = n // closed: every slot must still have finished
	}
	if free := st.free(); len(free) > 0 {
		t.Fatalf("segment %s: %d slots free to claim again, e.g. %v (open %v, runs %d, ok %d, moved %d, exits %d)",
			seg, len(free), free[:min(len(free), 5)], st.open, len(st.runs), len(st.ok), len(st.moved), len(st.exits))
	}
	if len(st.runs) > 0 {
		t.Fatalf("segment %s: %d runs left after the run's last outcome", seg, len(st.runs))
	}
	other := e.worker(t, WorkerConfig{})
	if again, _, err := other.sched.claimSegment(context.Background(), 0, seg, SegmentSize); err != nil || len(again) > 0 {
		t.Fatalf("another worker claimed %d tasks of segment %s again (%v)", len(again), seg, err)
	}
}

// TestReviewCancelRacingOutcomesKeepsTheRun: a task of a run is cancelled
// (Client.Cancel writes its exit) before the worker, which has not heard
// of it, writes the run's outcomes with w.commit. Asserted, for a run of
// 100 slots:
//
//   - "succeeded": 100 Succeeded outcomes (one outcome request for the
//     run): 99 tasks are SUCCEEDED, the cancelled one CANCELLED; Stats
//     say 99 succeeded, 1 cancelled, Total 100, Unfinished 0.
//   - "split by operations": 60 Retrying outcomes (the cancelled task's
//     first) then 40 Succeeded: 110 writes fill a nested transaction, so
//     runReqs splits the run in two, sent in one request: 59 RETRYING, 40
//     SUCCEEDED, 1 CANCELLED, nothing pending or running.
//   - "split by size": 100 Succeeded outcomes with 6 KiB results, which
//     runReqs splits by size: 99 SUCCEEDED, 1 CANCELLED.
//
// In each: the worker counts exactly one outcome fenced, the run is gone
// and no slot of the segment is free to be claimed again (nothing runs
// twice). Before the fix, the request that deleted the run went beside the
// outcomes (a delete of its own after a full batch of 100, or with the
// last part of a split run) and committed while the part with the
// cancelled slot was refused; that part, read back, found its run gone and
// dropped every outcome in it: their tasks were pending again and ran a
// second time. ("split by size" held before the fix too: parts that large
// go in requests of their own, in order; it covers the delete of a run
// after every part, which the fix added.)
func TestReviewCancelRacingOutcomesKeepsTheRun(t *testing.T) {
	env := newReviewEnv(t)
	for _, tc := range []struct {
		name      string
		retrying  int // the first outcomes are Retrying, the others Succeeded
		resultLen int
	}{
		{"succeeded", 0, 16},
		{"split by operations", 60, 16},
		{"split by size", 0, 6 << 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			e := env.space(t)
			const n = SegmentSize
			seg := e.submitSegment(t, "t", n)
			w := e.worker(t, WorkerConfig{Concurrency: n, Prefetch: n})
			claims := claimRun(t, w, seg, n)
			cancelled := claims[0].task.ID
			if _, err := e.c.Cancel(ctx, cancelled); err != nil {
				t.Fatalf("cancel %s: %v", cancelled, err)
			}
			batch := make([]outcome, n)
			for i, cl := range claims {
				if i < tc.retrying {
					batch[i] = outcome{c: cl, kind: Retrying, err: errors.New("boom"), delay: time.Hour}
					continue
				}
				res := []byte(fmt.Sprintf("%s:%s", cl.task.ID, strings.Repeat("r", tc.resultLen)))
				batch[i] = outcome{c: cl, kind: Succeeded, result: res}
			}
			w.commit(batch)

			got := e.statuses(t, claims)
			for i, cl := range claims {
				want := Succeeded
				switch {
				case cl.task.ID == cancelled:
					want = Cancelled
				case i < tc.retrying:
					want = Retrying
				}
				if got[cl.task.ID] != want {
					t.Fatalf("task %s (slot %d) is %s, want %s", cl.task.ID, cl.slot, got[cl.task.ID], want)
				}
			}
			retrying := int64(max(tc.retrying-1, 0))
			st := e.stats(t)
			if st.Total() != n || st.Cancelled != 1 || st.Retrying != retrying || st.Succeeded != n-1-retrying || st.Pending != 0 || st.Running != 0 {
				t.Fatalf("stats %+v: want %d tasks, 1 cancelled, %d retrying, %d succeeded, none pending or running", st, n, retrying, n-1-retrying)
			}
			if ws := w.Stats(); ws.Fenced != 1 || ws.Succeeded != n-1-retrying || ws.Retried != retrying {
				t.Fatalf("worker stats %+v: want 1 fenced, %d succeeded, %d retried", ws, n-1-retrying, retrying)
			}
			e.requireNothingFree(t, seg, n)
		})
	}
}

// TestReviewIdleWorkerFindsTaskBehindBusySegments: nine segments of two
// tasks each (nine submissions); a holder worker holds every task of the
// first eight (claimed with its own runs, which never end). Asserted:
//
//   - one claim (Worker.claim, Prefetch 100) of a fresh worker takes the
//     ninth segment's two tasks (deterministic: a single claim loop);
//   - once that worker's lease is revoked (the tasks are pending again),
//     a running worker (Concurrency 200, Prefetch 100) starts both
//     within 3 s.
//
// Before the fix a claim tried the first eight open segments only (it
// returned nothing, not even contended), found all their slots running,
// and the idle worker slept on its watch until the 30 s fallback timer,
// after which its marks of busy segments (2 s) had expired and it found
// the same eight again. (Run's second claim loop could, rarely, start
// after the first had marked the eight busy and find the ninth: the
// single claim makes the failure certain.)
func TestReviewIdleWorkerFindsTaskBehindBusySegments(t *testing.T) {
	ctx := context.Background()
	e := newReviewEnv(t).space(t)
	var segs []string
	for i := range 9 {
		segs = append(segs, e.submitSegment(t, fmt.Sprintf("s%d", i), 2))
	}
	g, err := e.cli.Get(ctx, e.c.keys.SegmentsOpen(reviewQueue), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	if len(g.Kvs) != 9 {
		t.Fatalf("%d open segments, want 9", len(g.Kvs))
	}
	for i, kv := range g.Kvs {
		if name, _ := keyspace.Last(e.c.keys.SegmentsOpen(reviewQueue), string(kv.Key)); name != segs[i] {
			t.Fatalf("open segment %d is %s, want %s (the submissions' order)", i, name, segs[i])
		}
	}
	holder := e.worker(t, WorkerConfig{})
	for _, seg := range segs[:8] {
		claimRun(t, holder, seg, 2)
	}

	probe := e.worker(t, WorkerConfig{Concurrency: 200, Prefetch: 100})
	got, _, _, err := probe.sched.claim(ctx, 0, 100)
	if err != nil || len(got) != 2 || got[0].run.seg != segs[8] {
		t.Fatalf("one claim behind 8 segments whose tasks all run took %d tasks (%v), want the ninth segment's 2", len(got), err)
	}
	if err := probe.Close(ctx); err != nil { // its run goes: the two are pending again
		t.Fatal(err)
	}

	w := e.worker(t, WorkerConfig{Concurrency: 200, Prefetch: 100, ShutdownTimeout: time.Second})
	ran := make(chan string, 32)
	w.HandleAll(func(ctx context.Context, tk *Task) ([]byte, error) {
		ran <- tk.ID
		return nil, nil
	})
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- w.Run(rctx) }()
	defer func() {
		stop()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("the worker did not stop within 10 s")
		}
	}()
	want := map[string]bool{"s8-000": true, "s8-001": true}
	deadline := time.After(3 * time.Second)
	for len(want) > 0 {
		select {
		case id := <-ran:
			if !want[id] {
				t.Fatalf("ran %s, which the holder holds", id)
			}
			delete(want, id)
		case <-deadline:
			t.Fatalf("after 3 s the idle worker had not run %v, pending behind 8 segments whose tasks all run", want)
		}
	}
	t.Logf("the ninth segment's tasks ran %s after the worker started", time.Since(start).Round(time.Millisecond))
}

// TestReviewClaimFenceRefusedAfterCancel: the claim of a task of a run, as
// a fence (a claimFence as a handler's context holds it, and ClaimFence of
// such a context), lets a write through while the task runs and refuses one
// (lease.ErrFenced, nothing applied) once Client.Cancel cancelled the task,
// although the worker has not heard of the cancel (its handler's context is
// not cancelled). A neighbour's claim in the same run still writes. Before
// the fix the fence compared the run's key alone, which a cancel leaves in
// place, so the write of a cancelled task went through.
func TestReviewClaimFenceRefusedAfterCancel(t *testing.T) {
	ctx := context.Background()
	e := newReviewEnv(t).space(t)
	seg := e.submitSegment(t, "t", 3)
	w := e.worker(t, WorkerConfig{})
	claims := claimRun(t, w, seg, 3)
	fenceOf := func(cl *claim) lease.Fence {
		fctx, cancel := context.WithCancelCause(ctx)
		t.Cleanup(func() { cancel(nil) })
		hctx := context.WithValue(fctx, claimKey{}, &claimFence{w: w, c: cl, cancel: cancel, ctx: fctx})
		return ClaimFence(hctx)
	}
	victim, neighbour := fenceOf(claims[1]), fenceOf(claims[2])
	key := "/" + e.ns + "/fenced"
	if _, err := victim.Txn(ctx).Then(clientv3.OpPut(key, "before")).Commit(); err != nil {
		t.Fatalf("write under a held claim: %v", err)
	}
	if _, err := e.c.Cancel(ctx, claims[1].task.ID); err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if victim.Err() != nil {
		t.Fatalf("the fence knows of the cancel already (%v): the test needs a worker that has not heard", victim.Err())
	}
	_, err := victim.Txn(ctx).Then(clientv3.OpPut(key, "after")).Commit()
	if !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("write under a cancelled task's claim: err %v, want lease.ErrFenced", err)
	}
	g, err := e.cli.Get(ctx, key)
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "before" {
		t.Fatalf("fenced key: %v, %v; want \"before\"", g, err)
	}
	if _, err := neighbour.Txn(ctx).Then(clientv3.OpPut(key, "neighbour")).Commit(); err != nil {
		t.Fatalf("write under a neighbour's claim in the same run: %v", err)
	}
}

// hookKV calls before with a transaction's writes before it commits.
type hookKV struct {
	clientv3.KV
	before func(then []clientv3.Op)
}

func (h *hookKV) Txn(ctx context.Context) clientv3.Txn { return &hookTxn{Txn: h.KV.Txn(ctx), h: h} }

type hookTxn struct {
	clientv3.Txn
	h    *hookKV
	then []clientv3.Op
}

func (x *hookTxn) If(cs ...clientv3.Cmp) clientv3.Txn { x.Txn = x.Txn.If(cs...); return x }

func (x *hookTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	x.then = append(x.then, ops...)
	x.Txn = x.Txn.Then(ops...)
	return x
}

func (x *hookTxn) Else(ops ...clientv3.Op) clientv3.Txn { x.Txn = x.Txn.Else(ops...); return x }

func (x *hookTxn) Commit() (*clientv3.TxnResponse, error) {
	x.h.before(x.then)
	return x.Txn.Commit()
}

// TestReviewBulkCancelRetriesAfterNeighbourClaimed: a bulk cancel of every
// pending task (Client.CancelTasks(q, Pending, nil)) of a segment of 10,
// during which another worker claims one of them: between the bulk
// cancel's read and its write (a hook on the canceller's etcd client runs
// the claim just before the first request of nested transactions
// commits). The claim changes the segment, so the first pass is refused
// for all ten; CancelTasks must read them again and cancel the nine still
// pending: it returns 9, the nine are CANCELLED, the claimed one RUNNING,
// and Stats say 9 cancelled, 1 running, none pending. Before the fix, the
// tasks refused were left as they were: CancelTasks returned 0 and every
// task stayed pending.
func TestReviewBulkCancelRetriesAfterNeighbourClaimed(t *testing.T) {
	ctx := context.Background()
	e := newReviewEnv(t).space(t)
	seg := e.submitSegment(t, "t", 10)
	w := e.worker(t, WorkerConfig{})
	var once sync.Once
	var claimed []*claim
	var claimErr error
	hooked := e.srv.Client(t)
	hooked.KV = &hookKV{KV: hooked.KV, before: func(then []clientv3.Op) {
		for _, op := range then {
			if op.IsTxn() { // the bulk change's write
				once.Do(func() { claimed, _, claimErr = w.sched.claimSegment(ctx, 0, seg, 1) })
				return
			}
		}
	}}
	hc, err := NewClient(hooked, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	n, err := hc.CancelTasks(ctx, reviewQueue, Pending, nil, nil)
	if claimErr != nil || len(claimed) != 1 {
		t.Fatalf("the claim in the middle of the bulk cancel took %d tasks: %v", len(claimed), claimErr)
	}
	if err != nil || n != 9 {
		t.Fatalf("CancelTasks: %d, %v; want 9 (every task but the one claimed in between)", n, err)
	}
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = fmt.Sprintf("t-%03d", i)
	}
	ts, err := e.c.getMany(ctx, ids)
	if err != nil || len(ts) != 10 {
		t.Fatalf("read the tasks: %d, %v", len(ts), err)
	}
	for _, tk := range ts {
		want := Cancelled
		if tk.ID == claimed[0].task.ID {
			want = Running
		}
		if tk.CurrentStatus != want {
			t.Fatalf("task %s is %s, want %s", tk.ID, tk.CurrentStatus, want)
		}
	}
	if st := e.stats(t); st.Cancelled != 9 || st.Running != 1 || st.Pending != 0 || st.Total() != 10 {
		t.Fatalf("stats %+v: want 9 cancelled, 1 running, none pending", st)
	}
}

// TestReviewStatsAfterCancelAndPurge: Stats of tasks in segments.
//
//   - "cancel running": of 10 tasks, a run holds 4; cancelling one of the
//     4 gives Running 3, Pending 6, Cancelled 1, Total 10. Before the fix
//     the cancelled slot's exit was taken off the pending count while its
//     run still counted it running: Running 4, Pending 5.
//   - "purge succeeded": of 10 tasks, 3 succeeded in a run; purging one of
//     them by id (Purge(q, Succeeded, [id])) gives Succeeded 2, Pending 7
//     (unchanged), Total 9, and the task is gone. Before the fix the purge
//     wrote the exit of a slot that left unfinished: Succeeded stayed 3
//     and Pending fell to 6.
func TestReviewStatsAfterCancelAndPurge(t *testing.T) {
	env := newReviewEnv(t)
	ctx := context.Background()
	t.Run("cancel running", func(t *testing.T) {
		e := env.space(t)
		seg := e.submitSegment(t, "t", 10)
		w := e.worker(t, WorkerConfig{})
		claims := claimRun(t, w, seg, 4)
		if st := e.stats(t); st.Running != 4 || st.Pending != 6 || st.Total() != 10 {
			t.Fatalf("stats before the cancel: %+v", st)
		}
		if _, err := e.c.Cancel(ctx, claims[1].task.ID); err != nil {
			t.Fatal(err)
		}
		if st := e.stats(t); st.Running != 3 || st.Pending != 6 || st.Cancelled != 1 || st.Total() != 10 {
			t.Fatalf("stats %+v: want 3 running, 6 pending, 1 cancelled", st)
		}
	})
	t.Run("purge succeeded", func(t *testing.T) {
		e := env.space(t)
		seg := e.submitSegment(t, "t", 10)
		w := e.worker(t, WorkerConfig{})
		claims := claimRun(t, w, seg, 3)
		batch := make([]outcome, len(claims))
		for i, cl := range claims {
			batch[i] = outcome{c: cl, kind: Succeeded, result: []byte("ok")}
		}
		w.commit(batch)
		if st := e.stats(t); st.Succeeded != 3 || st.Pending != 7 || st.Total() != 10 {
			t.Fatalf("stats before the purge: %+v", st)
		}
		id := claims[0].task.ID
		n, err := e.c.Purge(ctx, reviewQueue, Succeeded, []string{id}, nil)
		if err != nil || n != 1 {
			t.Fatalf("purge %s: %d, %v", id, n, err)
		}
		if st := e.stats(t); st.Succeeded != 2 || st.Pending != 7 || st.Running != 0 || st.Total() != 9 {
			t.Fatalf("stats %+v: want 2 succeeded, 7 pending (unchanged), 9 in all", st)
		}
		if _, err := e.c.Get(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatalf("get the purged task: %v, want ErrNotFound", err)
		}
	})
}

// signalWatcher closes watching when its first watch is opened.
type signalWatcher struct {
	clientv3.Watcher
	once     sync.Once
	watching chan struct{}
}

func (s *signalWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	s.once.Do(func() { close(s.watching) })
	return s.Watcher.Watch(ctx, key, opts...)
}

// TestReviewWaitEndsWhenSegmentPurged: Client.Wait on a pending task in a
// segment, given 10 s, returns within 3 s with ErrNotFound once
// Purge(q, Pending, nil) has removed the whole segment (the purge starts
// after Wait read the task and opened its watch). Before the fix Wait
// watched the segment's outcomes and exits only, which a whole-segment
// purge does not write, and blocked until its context ended.
func TestReviewWaitEndsWhenSegmentPurged(t *testing.T) {
	e := newReviewEnv(t).space(t)
	e.submitSegment(t, "t", 5)
	wcli := e.srv.Client(t)
	sw := &signalWatcher{Watcher: wcli.Watcher, watching: make(chan struct{})}
	wcli.Watcher = sw
	wc, err := NewClient(wcli, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	type result struct {
		err  error
		took time.Duration
	}
	done := make(chan result, 1)
	go func() {
		start := time.Now()
		_, err := wc.Wait(ctx, "t-002")
		done <- result{err, time.Since(start)}
	}()
	select {
	case <-sw.watching:
	case r := <-done:
		t.Fatalf("Wait returned before the purge: %v", r.err)
	case <-time.After(5 * time.Second):
		t.Fatal("Wait opened no watch within 5 s")
	}
	n, err := e.c.Purge(context.Background(), reviewQueue, Pending, nil, nil)
	if err != nil || n != 5 {
		t.Fatalf("purge: %d, %v; want 5", n, err)
	}
	purged := time.Now()
	select {
	case r := <-done:
		if !errors.Is(r.err, ErrNotFound) {
			t.Fatalf("Wait after the purge: %v, want ErrNotFound", r.err)
		}
		t.Logf("Wait returned %s after the purge", time.Since(purged).Round(time.Millisecond))
	case <-time.After(3 * time.Second):
		cancel()
		r := <-done
		t.Fatalf("Wait still blocked 3 s after its task's segment was purged (it then returned %v after %s)", r.err, r.took.Round(time.Millisecond))
	}
}
