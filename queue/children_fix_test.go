package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A child cancelled while it ran in one segment run with its siblings:
// the run's other outcomes, written again without the cancelled one's,
// are recorded, and the parent resumes with the three outcomes. The
// parent collects them (Collect): by default the cancelled child would
// fail it, and its end would cancel the siblings still running. The
// siblings return only after the parent's wait was checked for the
// cancel (its wake mark handled), so that ordering is always taken.
func TestChildCancelledInARunLetsSiblingsEnd(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	f := newFamily(3)
	f.opts = task.SpawnOptions{Collect: true}
	release, stopped := make(chan struct{}), make(chan struct{})
	f.child = func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		select {
		case <-release:
			return tk.Parameters, nil
		case <-ctx.Done():
			close(stopped) // the cancelled one
			return nil, context.Cause(ctx)
		}
	}
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	waitUntil(t, "the children to run", func() bool {
		st, err := c.Stats(ctx, "kids")
		return err == nil && st.Running == 3
	})
	if _, err := c.Cancel(ctx, "p.1.0"); err != nil {
		t.Fatal(err)
	}
	<-stopped
	waitUntil(t, "the parent's wake mark to be handled", func() bool {
		g, err := cli.Get(ctx, keyspace.MustNew(ns).ChildWakes("wf"), clientv3.WithPrefix(), clientv3.WithCountOnly())
		return err == nil && g.Count == 0
	})
	if st, err := c.Stats(ctx, "wf"); err != nil || st.Waiting != 1 {
		t.Fatalf("wf: %+v (%v); want the parent still waiting for its children", st, err)
	}
	close(release)
	for _, id := range []string{"p.1.1", "p.1.2"} {
		k := waitFinished(t, c, id)
		if k.CurrentStatus != queue.Succeeded {
			t.Fatalf("child %s: %s (%s); want SUCCEEDED", id, k.CurrentStatus, k.LastError)
		}
	}
	if p := waitFinished(t, c, "p"); p.CurrentStatus != queue.Succeeded {
		t.Fatalf("p: %s (%s); want SUCCEEDED", p.CurrentStatus, p.LastError)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	want := map[string]string{"p.1.0": task.ChildCancelled, "p.1.1": task.ChildSucceeded, "p.1.2": task.ChildSucceeded}
	if out := f.outcomes["p"]; len(out) != len(want) {
		t.Fatalf("outcomes of p: %+v; want %v", out, want)
	}
	for _, o := range f.outcomes["p"] {
		if want[o.ID] != o.Status {
			t.Fatalf("outcomes of p: %+v; want %v", f.outcomes["p"], want)
		}
	}
}

// One report of the outcomes of children of 160 parents, each claimed
// apart (a run each): every outcome is written, and every parent's wake
// mark put, in as many requests as etcd's 128 operations a level take.
func TestReportChildrenOfManyParents(t *testing.T) {
	const n = 160
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	ts := make([]queue.Task, n)
	for i := range ts {
		ts[i] = queue.Task{ID: fmt.Sprintf("p%d.1.0", i), Type: "x", Parent: fmt.Sprintf("p%d", i), ParentStep: 1, ParentQueue: "wf"}
	}
	if _, err := c.Submit(ctx, "kids", ts, nil); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cli, 60*time.Second)
	os := make([]queue.Outcome, n)
	for i := range os {
		got, err := c.Claim(ctx, "kids", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
		if err != nil || len(got) != 1 {
			t.Fatalf("claim %d: %v %v", i, got, err)
		}
		os[i] = queue.Outcome{Held: queue.Held{Queue: "kids", ID: got[0].ID, Token: got[0].Token, Lease: l.ID()}, Result: []byte(`"ok"`)}
	}
	rs, err := c.Report(ctx, os)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rs {
		if r.Err != nil {
			t.Fatalf("outcome %d: %v", i, r.Err)
		}
	}
	g, err := cli.Get(ctx, keyspace.MustNew(ns).ChildWakes("wf"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != n {
		t.Fatalf("%d wake marks (%v), want %d", g.Count, err, n)
	}
}

// Purging a parent's live children ends them for their parent: each is
// CANCELLED ("purged") among its outcomes, and the parent resumes. So
// does deleting their queue.
func TestPurgeLiveChildrenWakesTheirParent(t *testing.T) {
	purgeLiveChildren(t, func(ctx context.Context, c *queue.Client) (int, error) {
		return c.Purge(ctx, "idle", queue.Pending, nil, nil)
	})
}

func TestDeleteQueueOfLiveChildrenWakesTheirParent(t *testing.T) {
	purgeLiveChildren(t, func(ctx context.Context, c *queue.Client) (int, error) {
		return c.DeleteQueue(ctx, "idle", nil)
	})
}

// purgeLiveChildren makes a parent wait for two children in queue "idle",
// which no worker runs, removes them with purge, and checks the parent.
func purgeLiveChildren(t *testing.T, purge func(context.Context, *queue.Client) (int, error)) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	f := newFamily(0)
	f.children = func(string) []task.Child {
		return []task.Child{{Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x"}}
	}
	if err := c.SetConfig(ctx, "idle", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	waitUntil(t, "the parent to wait", func() bool {
		st, err := c.Stats(ctx, "idle")
		wf, werr := c.Stats(ctx, "wf")
		return err == nil && werr == nil && st.Pending == 2 && wf.Waiting == 1
	})
	if n, err := purge(ctx, c); err != nil || n != 2 {
		t.Fatalf("purge: %d (%v), want 2", n, err)
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	outs, _, err := store.ChildrenOf(ctx, "p", 1, "", 10)
	if err != nil || len(outs) != 2 || outs[0].Status != task.ChildCancelled || outs[0].Error != "purged" {
		t.Fatalf("outcomes of p: %+v (%v); want the two purges", outs, err)
	}
	waitFinished(t, c, "p")
}

// A child's key with a '.' is refused: under step 1 of p, key "2.1.0"
// would give p.1.2.1.0, the id of the first child of p.1.2's step 1.
func TestSpawnRefusesADotInAKey(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	f := newFamily(0)
	f.children = func(string) []task.Child { return []task.Child{{Queue: "kids", Type: "x", Key: "2.1.0"}} }
	setupFamily(t, c, "p")
	f.start(t, cli, ns)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "children[0].key") {
		t.Fatalf("p: %s (%s); want DEAD naming children[0].key", got.CurrentStatus, got.LastError)
	}
	if st, _ := c.Stats(context.Background(), "kids"); st.Total() != 0 {
		t.Fatalf("kids got tasks: %+v", st)
	}
}

// A task of a child's id but another parent (or none) is not a duplicate
// of that child: its submission is refused, as one with other content.
func TestSubmitOfAChildIDWithAnotherParentIsRefused(t *testing.T) {
	c, _ := newClient(t, etcdtest.Namespace(t))
	ctx := context.Background()
	child := queue.Task{ID: "p.1.0", Type: "x", Parent: "p", ParentStep: 1, ParentQueue: "wf"}
	if _, err := c.Submit(ctx, "kids", []queue.Task{child}, nil); err != nil {
		t.Fatal(err)
	}
	again, err := c.Submit(ctx, "kids", []queue.Task{child}, nil)
	if err != nil || len(again.Rejected) != 0 {
		t.Fatalf("the same child again: %+v (%v); want a duplicate", again, err)
	}
	for _, other := range []queue.Task{{ID: "p.1.0", Type: "x"}, {ID: "p.1.0", Type: "x", Parent: "p", ParentStep: 2, ParentQueue: "wf"}} {
		res, err := c.Submit(ctx, "kids", []queue.Task{other}, nil)
		if err != nil || len(res.Rejected) != 1 || !strings.Contains(res.Rejected[0].Error, "different content") {
			t.Fatalf("%+v: %+v (%v); want refused with different content", other, res, err)
		}
	}
}

// One run of children of 80 parents, ended together: each request of the
// run's outcomes puts its own children's parents' marks, within etcd's
// 128 operations a level with its writes, and every outcome is written.
func TestRunOfChildrenOfManyParents(t *testing.T) {
	const n = 80
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	ts := make([]queue.Task, n)
	for i := range ts {
		ts[i] = queue.Task{ID: fmt.Sprintf("p%d.1.0", i), Type: "x", Parent: fmt.Sprintf("p%d", i), ParentStep: 1, ParentQueue: "wf"}
	}
	if _, err := c.Submit(ctx, "kids", ts, nil); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", Concurrency: 100})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { <-release; return []byte(`"ok"`), nil })
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(wctx) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "every child to run", func() bool {
		st, err := c.Stats(ctx, "kids")
		return err == nil && st.Running == n
	})
	close(release)
	waitUntil(t, "every child to succeed", func() bool {
		st, err := c.Stats(ctx, "kids")
		return err == nil && st.Succeeded == n
	})
	g, err := cli.Get(ctx, keyspace.MustNew(ns).ChildWakes("wf"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != n {
		t.Fatalf("%d wake marks (%v), want %d", g.Count, err, n)
	}
}
