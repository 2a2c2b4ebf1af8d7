package queue_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// fakeClock is a settable clock.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// TestDelayedTasksFallDueByTheClock: with an injected clock, tasks given
// run_at or delay are SCHEDULED (stats, list, get), no claim takes them
// before their time, and each is claimable once the clock passes it; a
// time in the past is due at once.
func TestDelayedTasksFallDueByTheClock(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	ctx := context.Background()
	res, err := c.Submit(ctx, "d", []queue.Task{
		{ID: "at", Type: "x", RunAt: t0.Add(time.Hour)},
		{ID: "in", Type: "x", Delay: queue.Duration(30 * time.Minute)},
		{ID: "past", Type: "x", RunAt: t0.Add(-time.Hour)},
	}, nil)
	if err != nil || res.Submitted != 3 {
		t.Fatalf("submit: %+v %v", res, err)
	}
	st, err := c.Stats(ctx, "d")
	if err != nil || st.Scheduled != 2 || st.Pending != 1 {
		t.Fatalf("stats %+v (%v), want 2 scheduled and 1 pending", st, err)
	}
	page, err := c.List(ctx, "d", queue.Scheduled, queue.ListOptions{Limit: 10})
	if err != nil || len(page.Tasks) != 2 || page.Tasks[0].ID != "in" || page.Tasks[1].ID != "at" {
		t.Fatalf("list SCHEDULED: %v (%v), want in then at", page.Tasks, err)
	}
	got, err := c.Get(ctx, "at")
	if err != nil || got.CurrentStatus != queue.Scheduled || !got.ScheduledAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("get at: %+v (%v), want SCHEDULED at %v", got, err, t0.Add(time.Hour))
	}
	l := grantLease(t, cli, 10*time.Second)
	claim := func() []string {
		t.Helper()
		ts, err := c.Claim(ctx, "d", queue.ClaimRequest{Lease: l, Worker: "w", Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, tk := range ts {
			ids = append(ids, tk.ID)
		}
		return ids
	}
	if ids := claim(); strings.Join(ids, ",") != "past" {
		t.Fatalf("claimed %v at the start, want only past", ids)
	}
	for _, step := range []struct {
		at   time.Duration
		want string
	}{{29 * time.Minute, ""}, {30 * time.Minute, "in"}, {59 * time.Minute, ""}, {time.Hour, "at"}} {
		clk.set(t0.Add(step.at))
		if _, err := queue.PromoteScheduled(ctx, c, "d"); err != nil {
			t.Fatal(err)
		}
		if ids := claim(); strings.Join(ids, ",") != step.want {
			t.Fatalf("at +%v claimed %v, want %q", step.at, ids, step.want)
		}
	}
	if st, _ := c.Stats(ctx, "d"); st.Scheduled != 0 || st.Running != 3 {
		t.Fatalf("stats at the end %+v, want 0 scheduled, 3 running", st)
	}
}

// TestScheduledTasksCancelAndPurge: cancel by id, cancel by status and
// purge work on scheduled tasks, and what they removed is not claimed when
// its segment falls due.
func TestScheduledTasksCancelAndPurge(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	later := time.Now().Add(time.Hour)
	submitN(t, c, "cp", 4, func(tk *queue.Task) { tk.RunAt = later })
	if _, err := c.Cancel(ctx, "cp-0"); err != nil {
		t.Fatal(err)
	}
	if n, err := c.CancelTasks(ctx, "cp", queue.Scheduled, []string{"cp-1"}, nil); err != nil || n != 1 {
		t.Fatalf("cancel SCHEDULED: %d %v", n, err)
	}
	if st, _ := c.Stats(ctx, "cp"); st.Scheduled != 2 || st.Cancelled != 2 {
		t.Fatalf("stats %+v, want 2 scheduled, 2 cancelled", st)
	}
	if n, err := c.Purge(ctx, "cp", queue.Scheduled, nil, nil); err != nil || n != 2 {
		t.Fatalf("purge SCHEDULED: %d %v", n, err)
	}
	if st, _ := c.Stats(ctx, "cp"); st.Scheduled != 0 || st.Pending != 0 {
		t.Fatalf("stats after purge %+v, want nothing scheduled or pending", st)
	}
	queue.SetClock(c, func() time.Time { return later.Add(time.Second) })
	if _, err := queue.PromoteScheduled(ctx, c, "cp"); err != nil {
		t.Fatal(err)
	}
	ts, err := c.Claim(ctx, "cp", queue.ClaimRequest{Lease: grantLease(t, cli, 10*time.Second), Worker: "w", Max: 10})
	if err != nil || len(ts) != 0 {
		t.Fatalf("claimed %d tasks (%v) after all were cancelled or purged", len(ts), err)
	}
}

// TestDelayBadInput: run_at with delay, a negative delay and a time that
// does not parse are refused, naming the field, and store nothing.
func TestDelayBadInput(t *testing.T) {
	c, _ := newClient(t, etcdtest.Namespace(t))
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		task  queue.Task
		field string
	}{
		{"both", queue.Task{ID: "a", Type: "x", RunAt: time.Now().Add(time.Hour), Delay: queue.Duration(time.Minute)}, "run_at"},
		{"negative", queue.Task{ID: "b", Type: "x", Delay: queue.Duration(-time.Minute)}, "delay"},
		{"beyond", queue.Task{ID: "c", Type: "x", RunAt: time.Date(2999, 1, 1, 0, 0, 0, 0, time.UTC)}, "run_at"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ie *drover.InputError
			if err := tc.task.Validate(); !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("Validate: %v, want an input error on %s", err, tc.field)
			}
			res, err := c.Submit(ctx, "bad", []queue.Task{tc.task}, nil)
			if err != nil || res.Submitted != 0 || len(res.Rejected) != 1 || !strings.Contains(res.Rejected[0].Error, tc.field) {
				t.Fatalf("submit: %+v %v, want one line rejected naming %s", res, err, tc.field)
			}
		})
	}
	if _, err := queue.ParseLine([]byte(`{"task_id":"c","task_type":"x","run_at":"tomorrow"}`)); err == nil || !strings.Contains(err.Error(), "run_at") {
		t.Fatalf("ParseLine with run_at tomorrow: %v, want an error naming run_at", err)
	}
	if st, err := c.Stats(ctx, "bad"); err != nil || st.Total() != 0 {
		t.Fatalf("stats %+v (%v): something was stored", st, err)
	}
}

// TestWorkerClaimsDelayedTaskNotBeforeItsTime: a running worker claims a
// task submitted with a delay once it is due and never before (the same
// process's clock on both sides; no bound on lateness but a guard against
// hanging).
func TestWorkerClaimsDelayedTaskNotBeforeItsTime(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wd", Concurrency: 2})
	claimed := make(chan time.Time, 2)
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) {
		claimed <- time.Now()
		return nil, nil
	})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { _ = w.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	due := time.Now().Add(400 * time.Millisecond)
	if _, err := c.Submit(ctx, "wd", []queue.Task{{ID: "later", Type: "x", RunAt: due}}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case at := <-claimed:
		if at.Before(due) {
			t.Fatalf("claimed at %v, %v before its time", at, due.Sub(at))
		}
		t.Logf("claimed %v after its time", at.Sub(due))
	case <-time.After(time.Minute):
		t.Fatal("the delayed task was not claimed")
	}
}

// TestDeleteQueueTakesScheduledTasks: deleting a queue removes its
// scheduled tasks with their ids, which a new submission can use again.
func TestDeleteQueueTakesScheduledTasks(t *testing.T) {
	c, _ := newClient(t, etcdtest.Namespace(t))
	ctx := context.Background()
	submitN(t, c, "gone", 3, func(tk *queue.Task) { tk.Delay = queue.Duration(time.Hour) })
	if n, err := c.DeleteQueue(ctx, "gone", nil); err != nil || n != 3 {
		t.Fatalf("delete queue: %d %v, want 3 tasks deleted", n, err)
	}
	if res, err := c.Submit(ctx, "other", []queue.Task{{ID: "gone-0", Type: "x"}}, nil); err != nil || res.Submitted != 1 {
		t.Fatalf("resubmit gone-0 elsewhere: %+v %v: its id is still taken", res, err)
	}
}
