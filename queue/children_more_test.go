package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// An external worker that reports a child's result larger than a child
// may have ends the child DEAD with "result too large", as an in-process
// worker does; the same result from a task without a parent succeeds.
func TestReportOfALargeChildResultEndsItDead(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	ts := []queue.Task{
		{ID: "p.1.0", Type: "x", Parent: "p", ParentStep: 1, ParentQueue: "wf"},
		{ID: "plain", Type: "x"},
	}
	if _, err := c.Submit(ctx, "kids", ts, nil); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cli, 60*time.Second)
	got, err := c.Claim(ctx, "kids", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("claim: %v %v", got, err)
	}
	big := []byte(`"` + strings.Repeat("a", task.MaxChildResult) + `"`)
	os := make([]queue.Outcome, len(got))
	for i, tk := range got {
		os[i] = queue.Outcome{Held: held("kids", tk, l), Result: big}
	}
	rs, err := c.Report(ctx, os)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Err != nil {
			t.Fatalf("outcome %d: %v", i, r.Err)
		}
		want := queue.Succeeded
		if r.Task.ID == "p.1.0" {
			want = queue.Dead
		}
		if r.Task.CurrentStatus != want {
			t.Fatalf("%s: %s (%s); want %s", r.Task.ID, r.Task.CurrentStatus, r.Task.LastError, want)
		}
		if want == queue.Dead && (!strings.Contains(r.Task.LastError, queue.ErrResultLarge.Error()) || len(r.Task.Result) != 0) {
			t.Fatalf("dead child: error %q, %d bytes of result", r.Task.LastError, len(r.Task.Result))
		}
	}
}

// The size an outcome of a child is counted as, when outcomes are packed
// into requests within etcd's limit, is at least what its writes put: its
// record, and its outcome for its parent (a result that is not valid
// UTF-8 grows by a third there). Else a request of many such outcomes
// would pass etcd's request limit.
func TestChildOutcomeSizeCountsItsDoneValue(t *testing.T) {
	c, _ := newClient(t, etcdtest.Namespace(t))
	result := []byte(strings.Repeat("\xff", task.MaxChildResult))
	child := func() *queue.Task {
		return &queue.Task{ID: "p.1.0", Type: "x", Parent: "p", ParentStep: 1, ParentQueue: "wf", CurrentStatus: queue.Running, Attempt: 1}
	}
	reason := errors.New(strings.Repeat("e", 4096))
	for _, tc := range []struct {
		name   string
		kind   queue.Status
		result []byte
		reason error
		inRun  bool
	}{
		{"success with a record", queue.Succeeded, result, nil, false},
		{"success in a run", queue.Succeeded, result, nil, true},
		{"death with a record", queue.Dead, nil, reason, false},
		{"death in a run", queue.Dead, nil, reason, true},
	} {
		counted, written := queue.OutcomeSize(c, "kids", child(), tc.kind, tc.result, tc.reason, tc.inRun)
		if counted < written {
			t.Errorf("%s: counted %d bytes, puts %d", tc.name, counted, written)
		}
	}
}

// A cancel's cascade to the children is not cut short by the caller's
// context (an HTTP client gone once the parent is cancelled), and a
// cancel retried of a parent cancelled already (its cascade cut short)
// still cancels its live children, answering ErrFinished.
func TestCancelCascadeOutlivesItsCallerAndIsRetried(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	f := newFamily(0)
	f.children = func(string) []task.Child {
		return []task.Child{{Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x"}}
	}
	ctx := context.Background()
	if err := c.SetConfig(ctx, "idle", queue.Config{}); err != nil { // no worker runs it
		t.Fatal(err)
	}
	setupFamily(t, c, "gone", "again")
	f.start(t, cli, ns)
	waitUntil(t, "the parents to wait", func() bool {
		st, err := c.Stats(ctx, "idle")
		wf, werr := c.Stats(ctx, "wf")
		return err == nil && werr == nil && st.Pending == 4 && wf.Waiting == 2
	})
	cctx, hangUp := context.WithCancel(ctx)
	defer hangUp()
	queue.SetCancelHook(func(string) { hangUp() })
	t.Cleanup(func() { queue.SetCancelHook(nil) })
	if _, err := c.Cancel(cctx, "gone"); err != nil {
		t.Fatalf("cancel with the caller gone after the parent's cancel: %v", err)
	}
	queue.SetCancelHook(nil)
	if _, err := queue.CancelAlone(ctx, c, "again"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Cancel(ctx, "again"); !errors.Is(err, queue.ErrFinished) {
		t.Fatalf("cancel again: %v; want ErrFinished", err)
	}
	for _, p := range []string{"gone", "again"} {
		for _, id := range []string{p + ".1.0", p + ".1.1"} {
			if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Cancelled {
				t.Fatalf("child %s: %+v (%v); want CANCELLED", id, got, err)
			}
		}
	}
}
