package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestExternalReport: one Report records the outcomes of two claims (one
// request per run): acks, a transient and a permanent failure; an outcome
// with another claim's token, another lease or a task not in the queue is
// refused alone, and so is the same claim reported twice; the runs' last
// outcomes end them, and nothing is left running. Bad input writes nothing.
func TestExternalReport(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "rep", 6, nil)
	l := grantLease(t, cli, 10*time.Second)
	other := grantLease(t, cli, 10*time.Second)
	a, err := c.Claim(ctx, "rep", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(a) != 2 {
		t.Fatalf("%v %v", a, err)
	}
	b, err := c.Claim(ctx, "rep", queue.ClaimRequest{Lease: l, Worker: "w", Max: 4})
	if err != nil || len(b) != 4 {
		t.Fatalf("%v %v", b, err)
	}
	if _, err := c.Report(ctx, []queue.Outcome{{Held: held("rep", a[0], l)}, {Held: queue.Held{Queue: "rep", ID: a[1].ID}}}); !errors.As(err, new(*drover.InputError)) ||
		!strings.Contains(err.Error(), "outcomes[1].token") {
		t.Fatalf("bad input: %v", err)
	}
	stale := held("rep", a[1], l)
	stale.Token = b[0].Token
	wrongLease := held("rep", b[3], other)
	rs, err := c.Report(ctx, []queue.Outcome{
		{Held: held("rep", a[0], l), Result: []byte("r0")},
		{Held: stale},
		{Held: held("rep", b[0], l), Failed: true, Error: "flaky"},
		{Held: held("rep", b[1], l), Failed: true, Error: "broken", Permanent: true},
		{Held: queue.Held{Queue: "rep", ID: "nope", Token: 9}},
		{Held: wrongLease},
		{Held: held("rep", a[0], l), Failed: true, Error: "twice"},
		{Held: held("rep", b[2], l)},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []any{queue.Succeeded, lease.ErrFenced, queue.Retrying, queue.Dead, queue.ErrNotFound, lease.ErrFenced, lease.ErrFenced, queue.Succeeded}
	for i, w := range want {
		switch w := w.(type) {
		case error:
			if !errors.Is(rs[i].Err, w) {
				t.Errorf("outcome %d: %+v, want %v", i, rs[i], w)
			}
		case queue.Status:
			if rs[i].Err != nil || rs[i].Task.CurrentStatus != w || rs[i].Task.Attempt != 1 {
				t.Errorf("outcome %d: %+v, want %s", i, rs[i], w)
			}
		}
	}
	// The refused outcomes wrote nothing: those claims still hold.
	rs, err = c.Report(ctx, []queue.Outcome{{Held: held("rep", a[1], l)}, {Held: held("rep", b[3], l)}})
	if err != nil || rs[0].Err != nil || rs[1].Err != nil {
		t.Fatalf("%+v %v", rs, err)
	}
	got, err := c.Get(ctx, a[0].ID)
	if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != "r0" {
		t.Fatalf("%+v %v", got, err)
	}
	// The runs went with their last outcomes, and the finished segment
	// closed.
	keys := keyspace.MustNew(ns)
	for _, pre := range []string{keys.Runs("rep", ""), keys.SegmentsOpen("rep")} {
		if g, err := cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
			t.Fatalf("%d keys under %s: %v", g.Count, pre, err)
		}
	}
	st, err := c.Stats(ctx, "rep")
	if err != nil || st.Succeeded != 4 || st.Retrying != 1 || st.Dead != 1 || st.Running != 0 || st.Pending != 0 {
		t.Fatalf("%+v %v", st, err)
	}
}

// TestReportClosesFinishedSegments: one report with the outcomes of twenty
// tasks, each submitted alone (a segment each) and claimed by a session of
// its own, finishes all twenty segments, and closes every one of them
// (their states read in one request and the closes written in one more):
// no segment of the queue is left open, and the stats count all twenty.
func TestReportClosesFinishedSegments(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	const n = 20
	var os []queue.Outcome
	for i := range n {
		if _, err := c.Submit(ctx, "closing", []queue.Task{{ID: fmt.Sprintf("t%d", i), Type: "t"}}, nil); err != nil {
			t.Fatal(err)
		}
		l := grantLease(t, cli, 30*time.Second)
		ts, err := c.Claim(ctx, "closing", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
		if err != nil || len(ts) != 1 {
			t.Fatalf("claim %d: %v, %v", i, ts, err)
		}
		os = append(os, queue.Outcome{Held: held("closing", ts[0], l)})
	}
	rs, err := c.Report(ctx, os)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Err != nil || r.Task.CurrentStatus != queue.Succeeded {
			t.Fatalf("outcome %d: %+v", i, r)
		}
	}
	open, err := cli.Get(ctx, keyspace.MustNew(ns).SegmentsOpen("closing"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	if open.Count != 0 {
		t.Fatalf("%d of the %d finished segments left open", open.Count, n)
	}
	if st, err := c.Stats(ctx, "closing"); err != nil || st.Succeeded != n || st.Unfinished() != 0 {
		t.Fatalf("stats %+v, %v", st, err)
	}
}
