package queue_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// parkedOnB makes task rsig-0 that was answered its signal a, parked on
// b (consuming a), then woken by b: it returns the claim after the wake,
// which shows the wait for b.
func parkedOnB(t *testing.T, c *queue.Client, l *lease.Lease) *queue.Task {
	t.Helper()
	ctx := context.Background()
	id := "rsig-0"
	submitN(t, c, "rsig", 1, func(tk *queue.Task) {
		tk.BackoffBase, tk.BackoffMax = queue.Duration(time.Millisecond), queue.Duration(time.Millisecond)
	})
	if _, err := c.Signal(ctx, id, "a", nil, "a-"+id); err != nil {
		t.Fatal(err)
	}
	tk := claimOne(t, c, l)
	h := held("rsig", tk, l)
	rep, err := c.Report(ctx, []queue.Outcome{{Held: h, Wait: &task.Wait{Signals: []string{"a"}}}})
	if err != nil || rep[0].Err != nil || rep[0].Signal == nil {
		t.Fatalf("wait a: %+v, %v; want answered", rep, err)
	}
	a := []queue.SignalRef{{Name: "a", IdempotencyKey: "a-" + id}}
	rep, err = c.Report(ctx, []queue.Outcome{{Held: h, Wait: &task.Wait{Signals: []string{"b"}}, Received: a}})
	if err != nil || rep[0].Err != nil || rep[0].Signal != nil || rep[0].Task.CurrentStatus != queue.Waiting {
		t.Fatalf("wait b: %+v, %v; want parked", rep, err)
	}
	if r, err := c.Signal(ctx, id, "b", nil, "b-"+id); err != nil || !r.Woke {
		t.Fatalf("signal b: %+v, %v; want woke", r, err)
	}
	return resumedAtB(t, c, l)
}

// claimOne claims one task of rsig under l, waiting for one to be due.
func claimOne(t *testing.T, c *queue.Client, l *lease.Lease) *queue.Task {
	t.Helper()
	var got *queue.Task
	waitUntil(t, "a task to claim", func() bool {
		ts, err := c.Claim(context.Background(), "rsig", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1, Wait: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) == 1 {
			got = ts[0]
		}
		return got != nil
	})
	return got
}

// resumedAtB claims the task and asserts the claim resumes at the wait
// for b.
func resumedAtB(t *testing.T, c *queue.Client, l *lease.Lease) *queue.Task {
	t.Helper()
	tk := claimOne(t, c, l)
	if wf := tk.WaitingFor; wf == nil || !slices.Equal(wf.Signals, []string{"b"}) {
		t.Fatalf("the claim of %s resumes at %+v; want the wait for b", tk.ID, wf)
	}
	return tk
}

// answerB reports the wait for b of claim tk again and asserts it is
// answered b.
func answerB(t *testing.T, c *queue.Client, l *lease.Lease, tk *queue.Task) []queue.SignalRef {
	t.Helper()
	rep, err := c.Report(context.Background(), []queue.Outcome{{Held: held("rsig", tk, l), Wait: &task.Wait{Signals: []string{"b"}, Until: tk.WaitingFor.Until}}})
	if err != nil || rep[0].Err != nil || rep[0].Signal == nil || rep[0].Signal.Name != "b" {
		t.Fatalf("wait b again: %+v, %v; want answered b", rep, err)
	}
	return []queue.SignalRef{{Name: "b", IdempotencyKey: rep[0].Signal.IdempotencyKey}}
}

// finishAtB runs the claim tk to its end as a handler that resumes at
// b: answered b, then a success naming it.
func finishAtB(t *testing.T, c *queue.Client, l *lease.Lease, tk *queue.Task) {
	t.Helper()
	b := answerB(t, c, l, tk)
	rep, err := c.Report(context.Background(), []queue.Outcome{{Held: held("rsig", tk, l), Result: []byte(`1`), Received: b}})
	if err != nil || rep[0].Err != nil {
		t.Fatal(rep, err)
	}
}

// A claim that resumed at a wait (after a park that consumed the signal
// before it) and ends in a retry, a sleep or a dead letter (then
// requeued) consumes nothing and leaves the task resuming at that wait:
// the next claim is answered the same signal, never needs the one the
// park consumed, and its success consumes each signal once.
func TestReceivedSignalResumeKeptAfterRetrySleepDead(t *testing.T) {
	for _, how := range []string{"retry", "sleep", "dead"} {
		t.Run(how, func(t *testing.T) {
			ctx := context.Background()
			ns := etcdtest.Namespace(t)
			c, cli := newClient(t, ns)
			l := grantLease(t, cli, 30*time.Second)
			tk := parkedOnB(t, c, l)
			o := queue.Outcome{Held: held("rsig", tk, l), Received: answerB(t, c, l, tk)}
			switch how {
			case "retry":
				o.Failed, o.Error = true, "transient"
			case "sleep":
				o.SleepUntil = time.Now().Add(10 * time.Millisecond)
			case "dead":
				o.Failed, o.Error, o.Permanent = true, "for good", true
			}
			rep, err := c.Report(ctx, []queue.Outcome{o})
			if err != nil || rep[0].Err != nil {
				t.Fatal(rep, err)
			}
			keys := keyspace.MustNew(ns)
			if seen, _ := cli.Get(ctx, keys.TaskSignalSeen(tk.ID, "b", "b-"+tk.ID), clientv3.WithCountOnly()); seen.Count != 0 {
				t.Fatalf("the %s consumed b", how)
			}
			if how == "dead" {
				if rep[0].Task.CurrentStatus != queue.Dead {
					t.Fatalf("%s: %s, want DEAD", tk.ID, rep[0].Task.CurrentStatus)
				}
				if n, err := c.Requeue(ctx, "rsig", []string{tk.ID}, nil); err != nil || n != 1 {
					t.Fatal(n, err)
				}
			}
			finishAtB(t, c, l, resumedAtB(t, c, l))
			checkConsumedOnce(t, c, cli, ns, tk.ID, 2)
		})
	}
}

// A claim that resumed at a wait, whose next wait's park finds a signal
// it waits for come meanwhile, is handed back keeping the wait it
// resumed at: the next claim resumes there, not at the start.
func TestReceivedSignalResumeKeptAfterHandBack(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	l := grantLease(t, cli, 30*time.Second)
	tk := parkedOnB(t, c, l)
	b := answerB(t, c, l, tk)
	var once sync.Once
	queue.SetBeforeParkHook(func() {
		once.Do(func() {
			if _, err := c.Signal(ctx, tk.ID, "c", nil, "c-"+tk.ID); err != nil {
				t.Error(err)
			}
		})
	})
	defer queue.SetBeforeParkHook(nil)
	rep, err := c.Report(ctx, []queue.Outcome{{Held: held("rsig", tk, l), Wait: &task.Wait{Signals: []string{"c"}}, Received: b}})
	if err != nil || rep[0].Err != nil || rep[0].Signal != nil {
		t.Fatalf("wait c: %+v, %v; want it to go to its park", rep, err)
	}
	queue.SetBeforeParkHook(nil)
	if got, err := c.Get(ctx, tk.ID); err != nil || got.CurrentStatus != queue.Pending {
		t.Fatalf("%s after the park met c: %+v, %v; want PENDING", tk.ID, got, err)
	}
	finishAtB(t, c, l, resumedAtB(t, c, l))
	sigs, err := c.Signals(ctx, tk.ID)
	if err != nil || len(sigs) != 3 {
		t.Fatal(sigs, err)
	}
	for _, s := range sigs {
		if s.Consumed != (s.Name != "c") {
			t.Fatalf("signals %+v: want a and b consumed, c not", sigs)
		}
	}
}
