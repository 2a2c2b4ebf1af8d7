package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// idleChildren are two children in "idle" (no worker runs there: they
// stay PENDING until cancelled).
func idleChildren(string) []task.Child {
	return []task.Child{{Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x"}}
}

// countPrefix is how many keys are stored under pre.
func countPrefix(t *testing.T, cli *clientv3.Client, pre string) int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), pre, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count
}

// The cancels a parent's cascade makes record each child as ended (its
// done key) but not as failed: a parent requeued later would otherwise
// fail at once of the children its own end cancelled.
func TestCascadeCancelWritesNoFailedMark(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = idleChildren
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Waiting, "p")
	stop()
	ctx := context.Background()
	if _, err := c.Cancel(ctx, "p"); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c, queue.Cancelled, "p.1.0", "p.1.1")
	keys := keyspace.MustNew(ns)
	if n := countPrefix(t, cli, keys.ChildDones("p", 1)); n != 2 {
		t.Fatalf("%d done keys after the cascade; want 2", n)
	}
	if n := countPrefix(t, cli, keys.ChildFaileds("p", 1)); n != 0 {
		t.Fatalf("%d failed marks after the cascade; want 0 (its cancels are not failures)", n)
	}
}

// A purge of a CANCELLED parent whose cascade is not finished (its
// canceller is held before the cascade) finishes the cascade first: the
// plan that names the children goes with the parent, and the children
// would otherwise stay live for good.
func TestCascadeFinishedBeforePurge(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = idleChildren
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Waiting, "p")
	stop()

	var calls atomic.Int32
	held, release := make(chan struct{}), make(chan struct{})
	queue.SetCascadeRunHook(func(string) {
		if calls.Add(1) == 1 {
			close(held)
			<-release
		}
	})
	cancelled := make(chan struct{})
	t.Cleanup(func() {
		close(release)
		<-cancelled
		queue.SetCascadeRunHook(nil)
	})
	ctx := context.Background()
	go func() { defer close(cancelled); _, _ = c.Cancel(ctx, "p") }()
	<-held
	if n, err := c.Purge(ctx, "wf", queue.Cancelled, []string{"p"}, nil); err != nil || n != 1 {
		t.Fatalf("purge: %d, %v; want 1 purged", n, err)
	}
	for _, id := range []string{"p.1.0", "p.1.1"} {
		if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Cancelled {
			t.Fatalf("child %s after the purge of its parent: %+v (%v); want CANCELLED", id, got, err)
		}
	}
	if n := markCount(t, cli, ns); n != 0 {
		t.Fatalf("%d cascade marks after the purge; want 0", n)
	}
}

// DeleteQueue removes the queue's cascade and wake marks with it.
func TestCascadeMarksGoWithTheQueue(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	setupFamily(t, c, "p")
	ctx := context.Background()
	if _, err := cli.Put(ctx, keys.ChildWake("wf", "gone"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, keys.ChildCascade("wf", "gone"), ""); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DeleteQueue(ctx, "wf", nil); err != nil {
		t.Fatal(err)
	}
	if n := countPrefix(t, cli, keys.ChildWakes("wf")) + countPrefix(t, cli, keys.ChildCascades("wf")); n != 0 {
		t.Fatalf("%d child marks of the deleted queue left; want 0", n)
	}
}

// A cascade's cancels hold only while the parent's record is as the
// cascade read it: a parent changed meanwhile (here its record rewritten,
// as a requeue rewrites it) stops the cascade, the children stay live and
// the mark stays; the next cascade, which reads the parent again, cancels
// them and removes the mark.
func TestCascadeFencedByTheParentsRecord(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = idleChildren
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Waiting, "p")
	stop()

	ctx := context.Background()
	rec := keyspace.MustNew(ns).TaskRecord("p")
	var calls atomic.Int32
	queue.SetCascadeRunHook(func(string) {
		if calls.Add(1) != 1 {
			return
		}
		g, err := cli.Get(ctx, rec)
		if err != nil || len(g.Kvs) != 1 {
			t.Errorf("read p's record: %v", err)
			return
		}
		if _, err := cli.Put(ctx, rec, string(g.Kvs[0].Value)); err != nil {
			t.Errorf("rewrite p's record: %v", err)
		}
	})
	t.Cleanup(func() { queue.SetCascadeRunHook(nil) })
	if _, err := c.Cancel(ctx, "p"); err == nil {
		t.Fatal("cancel of p answered no error; want its cascade stopped by the changed parent")
	}
	for _, id := range []string{"p.1.0", "p.1.1"} {
		if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Pending {
			t.Fatalf("child %s after the fenced cascade: %+v (%v); want PENDING", id, got, err)
		}
	}
	if n := markCount(t, cli, ns); n != 1 {
		t.Fatalf("%d cascade marks after the fenced cascade; want 1 (kept)", n)
	}
	if _, err := c.Cancel(ctx, "p"); !errors.Is(err, queue.ErrFinished) {
		t.Fatalf("second cancel of p: %v; want ErrFinished, its cascade run again", err)
	}
	wantStatus(t, c, queue.Cancelled, "p.1.0", "p.1.1")
	if n := markCount(t, cli, ns); n != 0 {
		t.Fatalf("%d cascade marks after the second cascade; want 0", n)
	}
}

// A worker's scan leaves a cascade mark another scanner claimed while the
// claim holds, and works on it once the claim expired: one scanner works
// on a mark at a time.
func TestCascadeScanHonoursClaims(t *testing.T) {
	t.Cleanup(queue.SetCascadeRescan(100 * time.Millisecond)) // first: restored after the workers stop
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = idleChildren
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Waiting, "p")
	stop()

	// Cancelled alone: its mark written, its cascade not run.
	ctx := context.Background()
	if _, err := queue.CancelAlone(ctx, c, "p"); err != nil {
		t.Fatal(err)
	}
	mark := keyspace.MustNew(ns).ChildCascade("wf", "p")
	claim := func(until time.Time) {
		t.Helper()
		b, _ := json.Marshal(map[string]any{"worker": "another", "until": until})
		if _, err := cli.Put(ctx, mark, string(b)); err != nil {
			t.Fatal(err)
		}
	}
	claim(time.Now().Add(time.Hour))
	stop = runParents(t, cli, ns, f)
	time.Sleep(2 * time.Second) // many rescans at 100 ms
	for _, id := range []string{"p.1.0", "p.1.1"} {
		if got, err := c.Get(ctx, id); err != nil || got.CurrentStatus != queue.Pending {
			t.Fatalf("child %s while another holds the mark: %+v (%v); want PENDING", id, got, err)
		}
	}
	claim(time.Now().Add(-time.Second))
	wantStatus(t, c, queue.Cancelled, "p.1.0", "p.1.1")
	waitUntil(t, "the cascade mark to go", func() bool { return markCount(t, cli, ns) == 0 })
	stop()
}
