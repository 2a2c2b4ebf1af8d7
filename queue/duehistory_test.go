package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// statuses returns the statuses of t's history, in order.
func statuses(t *queue.Task) []queue.Status {
	var out []queue.Status
	for _, tr := range t.Transitions {
		out = append(out, tr.Status)
	}
	return out
}

func sameStatuses(a, b []queue.Status) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestScheduledHistoryAndRunNow: a scheduled task's history keeps
// SCHEDULED once it fell due (then PENDING at its due time, RUNNING once
// claimed); RunNow makes one scheduled task due at once, PENDING with a
// history that says so, while its neighbours keep their time.
func TestScheduledHistoryAndRunNow(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	submitN(t, c, "h", 3, func(tk *queue.Task) { tk.RunAt = t0.Add(time.Hour) })
	if n, err := c.RunNow(ctx, "h", []string{"h-0"}, nil); err != nil || n != 1 {
		t.Fatalf("run h-0 now: %d (%v)", n, err)
	}
	got, err := c.Get(ctx, "h-0")
	if want := []queue.Status{queue.Scheduled, queue.Pending}; err != nil || got.CurrentStatus != queue.Pending || !sameStatuses(statuses(got), want) {
		t.Fatalf("h-0 after run now: %s %v (%v), want PENDING with history %v", got.CurrentStatus, statuses(got), err, want)
	}
	if st, _ := c.Stats(ctx, "h"); st.Scheduled != 2 || st.Pending != 1 {
		t.Fatalf("stats %+v, want 2 scheduled and 1 pending", st)
	}
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "h", queue.ClaimRequest{Lease: l, Worker: "w", Max: 10})
	if err != nil || len(ts) != 1 || ts[0].ID != "h-0" {
		t.Fatalf("claim before the others are due: %v (%v), want only h-0", ts, err)
	}
	if _, err := c.RunNow(ctx, "h", []string{"h-0"}, nil); err == nil {
		t.Fatal("run now of a task no longer scheduled: no error")
	}
	clk.set(t0.Add(2 * time.Hour))
	if _, err := queue.PromoteScheduled(ctx, c, "h"); err != nil {
		t.Fatal(err)
	}
	got, err = c.Get(ctx, "h-1")
	if want := []queue.Status{queue.Scheduled, queue.Pending}; err != nil || got.CurrentStatus != queue.Pending || !sameStatuses(statuses(got), want) {
		t.Fatalf("h-1 once due: %s %v (%v), want PENDING with history %v", got.CurrentStatus, statuses(got), err, want)
	}
	if !got.Transitions[1].At.Equal(t0.Add(time.Hour)) {
		t.Fatalf("h-1 became PENDING at %v, want its due time %v", got.Transitions[1].At, t0.Add(time.Hour))
	}
	if ts, err := c.Claim(ctx, "h", queue.ClaimRequest{Lease: l, Worker: "w", Max: 10}); err != nil || len(ts) != 2 {
		t.Fatalf("claim once due: %d tasks (%v), want 2", len(ts), err)
	}
	got, err = c.Get(ctx, "h-2")
	if want := []queue.Status{queue.Scheduled, queue.Pending, queue.Running}; err != nil || !sameStatuses(statuses(got), want) {
		t.Fatalf("h-2 claimed: %v (%v), want history %v", statuses(got), err, want)
	}
}

// TestDrainDoesNotWaitForLaterTasks: a draining worker runs what is
// pending and returns, leaving a task scheduled an hour ahead SCHEDULED.
func TestDrainDoesNotWaitForLaterTasks(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "dr", 2, nil)
	if _, err := c.Submit(ctx, "dr", []queue.Task{{ID: "later", Type: "x", Delay: queue.Duration(time.Hour)}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "dr", Concurrency: 2, Drain: true})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a guard against hanging only
		t.Fatal("a draining worker did not return with a task scheduled an hour ahead")
	}
	if st, _ := c.Stats(ctx, "dr"); st.Scheduled != 1 || st.Succeeded != 2 {
		t.Fatalf("stats after the drain %+v, want 1 scheduled and 2 succeeded", st)
	}
}
