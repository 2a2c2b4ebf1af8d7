package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestReportFromMemory: the successes of a Client's own claims are written
// from its memory of the claims (no read), and each outcome stays fenced:
// a second ack of the same claim is refused; when another process (a
// second Client, as a second server in front of the same etcd) wrote an
// outcome of the run, or a task of the segment was cancelled, the write
// from memory is refused by etcd and the outcomes are read and written
// again, correctly; an ack after the claim's lease ended is refused. At the
// end every task is in exactly one terminal state.
func TestReportFromMemory(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	a, cli := newClient(t, ns)
	b, _ := newClient(t, ns)
	submitN(t, a, "mem", 12, nil)
	l := grantLease(t, cli, 10*time.Second)
	claim := func(n int) []*queue.Task {
		t.Helper()
		ts, err := a.Claim(ctx, "mem", queue.ClaimRequest{Lease: l, Worker: "w", Max: n})
		if err != nil || len(ts) != n {
			t.Fatalf("claim %d: %d tasks, %v", n, len(ts), err)
		}
		return ts
	}
	ack := func(c *queue.Client, tk *queue.Task) error {
		t.Helper()
		got, err := c.Ack(ctx, held("mem", tk, l), []byte("ok"))
		if err == nil && (got.CurrentStatus != queue.Succeeded || string(got.Result) != "ok" || got.ID != tk.ID) {
			t.Fatalf("ack of %s answered %+v", tk.ID, got)
		}
		return err
	}

	// From memory: four acks of one run, no refusal; a second ack is fenced.
	run := claim(4)
	for _, tk := range run {
		if err := ack(a, tk); err != nil {
			t.Fatal(err)
		}
	}
	if err := ack(a, run[0]); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("second ack: %v, want fenced", err)
	}
	if hits, stale := queue.RememberedOutcomes(a); hits != 4 || stale != 0 {
		t.Fatalf("from memory: %d written, %d stale; want 4, 0", hits, stale)
	}

	// Another client writes an outcome of the run: a's memory is stale,
	// etcd refuses the write from it, and the read path writes it.
	run = claim(4)
	if err := ack(b, run[0]); err != nil {
		t.Fatal(err)
	}
	for _, tk := range run[1:] {
		if err := ack(a, tk); err != nil {
			t.Fatal(err)
		}
	}
	if _, stale := queue.RememberedOutcomes(a); stale != 1 {
		t.Fatalf("%d stale writes after another client's outcome; want 1", stale)
	}

	// A task of the segment cancelled while claimed: the same.
	run = claim(2)
	if _, err := a.Cancel(ctx, run[0].ID); err != nil {
		t.Fatal(err)
	}
	if err := ack(a, run[1]); err != nil {
		t.Fatal(err)
	}
	if err := ack(a, run[0]); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("ack of a cancelled task: %v, want fenced", err)
	}
	// The write from memory that would have left the run behind (it did
	// not know the other slot had left) was refused, and the one from the
	// read ended the run: no run is left.
	if hits, stale := queue.RememberedOutcomes(a); hits != 4 || stale != 2 {
		t.Fatalf("after a cancellation: %d written from memory, %d stale; want 4, 2", hits, stale)
	}
	if g, err := cli.Get(ctx, keyspace.MustNew(ns).Runs("mem", ""), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
		t.Fatalf("runs left after every claim was reported: %v %v", g, err)
	}

	// The lease ends under a claim: its ack from memory is refused.
	run = claim(2)
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	for _, tk := range run {
		if err := ack(a, tk); !errors.Is(err, lease.ErrFenced) {
			t.Fatalf("ack after the lease ended: %v, want fenced", err)
		}
	}
	st, err := a.Stats(ctx, "mem")
	if err != nil {
		t.Fatal(err)
	}
	if st.Succeeded != 9 || st.Cancelled != 1 || st.Pending != 2 || st.Total() != 12 {
		t.Fatalf("stats %+v: want 9 succeeded, 1 cancelled, 2 pending (their lease ended)", st)
	}
}

// TestReportStaleMemoryMixedRun: one report of a success (from a stale
// memory of its claim) and a failure of the same run writes both and ends
// the run: the refused success is read again with the failure, in one
// write of the run, not two that each see the other's slot unfinished.
func TestReportStaleMemoryMixedRun(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	submitN(t, c, "mix", 3, nil)
	l := grantLease(t, cli, 10*time.Second)
	run, err := c.Claim(ctx, "mix", queue.ClaimRequest{Lease: l, Worker: "w", Max: 2})
	if err != nil || len(run) != 2 {
		t.Fatalf("claim: %d, %v", len(run), err)
	}
	if _, err := c.Cancel(ctx, "mix-2"); err != nil { // the segment's third task: the memory goes stale
		t.Fatal(err)
	}
	rs, err := c.Report(ctx, []queue.Outcome{{Held: held("mix", run[0], l)}, {Held: held("mix", run[1], l), Failed: true, Error: "flaky"}})
	if err != nil || rs[0].Err != nil || rs[1].Err != nil {
		t.Fatalf("%+v %v", rs, err)
	}
	if g, err := cli.Get(ctx, keyspace.MustNew(ns).Runs("mix", ""), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
		t.Fatalf("runs left after the run's outcomes were all written: %v %v", g, err)
	}
}
