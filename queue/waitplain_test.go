package queue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A plain task's wait that times out wakes it; its next claim shows the
// wait again, with its until and since (the record keeps them once), so
// that the wait reported again is answered with its timeout, the claim
// held, instead of parking the task again for ever.
func TestPlainWaitTimedOutClaimShowsUntil(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "pwt", 1, nil)
	l := grantLease(t, cli, 60*time.Second)
	ts, err := c.Claim(ctx, "pwt", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	until := time.Now().Add(300 * time.Millisecond).UTC().Truncate(time.Millisecond)
	rep, err := c.Report(ctx, []queue.Outcome{{Held: held("pwt", ts[0], l), Wait: &task.Wait{Signals: []string{"go"}, Until: until}}})
	if err != nil || rep[0].Err != nil || rep[0].Task.CurrentStatus != queue.Waiting {
		t.Fatalf("the wait: %+v %v; want WAITING", rep, err)
	}
	var again []*queue.Task
	for try := 0; try < 300 && err == nil && len(again) == 0; try++ {
		again, err = c.Claim(ctx, "pwt", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1, Wait: 100 * time.Millisecond})
	}
	if err != nil || len(again) != 1 || again[0].ID != ts[0].ID {
		t.Fatalf("claimed again %d, err %v", len(again), err)
	}
	wf := again[0].WaitingFor
	if wf == nil || !wf.Until.Equal(until) || wf.Since.IsZero() || wf.Since.After(until) {
		t.Fatalf("the claim after the timeout shows the wait %+v; want until %s and its since", wf, until)
	}
	rep, err = c.Report(ctx, []queue.Outcome{{Held: held("pwt", again[0], l), Wait: &task.Wait{Signals: wf.Signals, Until: wf.Until}}})
	if err != nil || rep[0].Err != nil {
		t.Fatal(rep, err)
	}
	if sg := rep[0].Signal; sg == nil || !sg.TimedOut || rep[0].Task.CurrentStatus != queue.Running {
		t.Fatalf("the wait reported again: %+v (signal %+v); want timed_out, RUNNING", rep[0].Task, sg)
	}
}

// A wait's Until more than task.MaxSleepYears ahead is bad input naming
// it, and nothing is written.
func TestPlainWaitUntilBounded(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "pwb", 1, nil)
	l := grantLease(t, cli, 60*time.Second)
	ts, err := c.Claim(ctx, "pwb", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	far := time.Now().AddDate(task.MaxSleepYears+1, 0, 0)
	_, err = c.Report(ctx, []queue.Outcome{{Held: held("pwb", ts[0], l), Wait: &task.Wait{Signals: []string{"go"}, Until: far}}})
	var ie *drover.InputError
	if !errors.As(err, &ie) || ie.Field != "outcomes[0].wait_signal.until" {
		t.Fatalf("a wait %d years ahead: %v; want an input error naming outcomes[0].wait_signal.until", task.MaxSleepYears+1, err)
	}
	if got, err := c.Get(ctx, ts[0].ID); err != nil || got.CurrentStatus != queue.Running {
		t.Fatalf("after the bad wait: %+v %v; want RUNNING still", got, err)
	}
	near := time.Now().AddDate(task.MaxSleepYears-1, 0, 0)
	if rep, err := c.Report(ctx, []queue.Outcome{{Held: held("pwb", ts[0], l), Wait: &task.Wait{Signals: []string{"go"}, Until: near}}}); err != nil || rep[0].Err != nil || rep[0].Task.CurrentStatus != queue.Waiting {
		t.Fatalf("a wait %d years ahead: %+v %v; want WAITING", task.MaxSleepYears-1, rep, err)
	}
}

// In a FIFO queue a task that waits goes back to shard 0 when it wakes,
// as one that sleeps or fails does: a wait reported for a claim the
// Client remembers must not take it back to its hash shard.
func TestFIFOWaitReportGoesToShardZero(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if err := c.SetConfig(ctx, "fw", queue.Config{FIFO: true}); err != nil {
		t.Fatal(err)
	}
	submitN(t, c, "fw", 8, nil)
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "fw", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(ts) != 2 {
		t.Fatal(len(ts), err)
	}
	id := ts[1].ID
	rep, err := c.Report(ctx, []queue.Outcome{{Held: held("fw", ts[1], l), Wait: &task.Wait{Signals: []string{"go"}}}})
	if err != nil || rep[0].Err != nil || rep[0].Task.CurrentStatus != queue.Waiting {
		t.Fatalf("the wait: %+v %v; want WAITING", rep, err)
	}
	if r, err := c.Signal(ctx, id, "go", nil, ""); err != nil || !r.Woke {
		t.Fatalf("the signal: %+v %v; want it to wake %s", r, err, id)
	}
	ks := keyspace.MustNew(ns)
	g, err := cli.Get(ctx, ks.QueuePending("fw"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, kv := range g.Kvs {
		if !strings.HasSuffix(string(kv.Key), "-"+id) {
			continue
		}
		found = true
		p, ok := ks.ParsePendingKey("fw", string(kv.Key))
		if !ok || p.Shard != 0 {
			t.Errorf("the woken FIFO task %s went back to %s (shard %d), want shard 0", id, kv.Key, p.Shard)
		}
	}
	if !found {
		t.Fatalf("the woken task %s has no pending key", id)
	}
}
