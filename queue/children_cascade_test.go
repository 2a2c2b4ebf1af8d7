package queue_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// failFastChildren is what the parents of the cascade tests spawn: the
// first child into "kids" (where the tests fail it), then two into "idle",
// where no worker runs (they stay PENDING, live, until cancelled), and a
// detached one into "idle".
func failFastChildren(string) []task.Child {
	return []task.Child{{Queue: "kids", Type: "x"}, {Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x"},
		{Queue: "idle", Type: "x", Detached: true}}
}

// runParents runs a worker of "wf" running f's parents until the returned
// function is called (which waits for it to stop).
func runParents(t *testing.T, cli *clientv3.Client, ns string, f *family) (stop func()) {
	t.Helper()
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", Concurrency: 4})
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		return queue.Steps(store, f.parentSteps(tk.ID)...)(ctx, tk)
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// runKids runs a worker of "kids" with handler h until the test ends.
func runKids(t *testing.T, cli *clientv3.Client, ns string, h queue.Handler) {
	t.Helper()
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", Concurrency: 8})
	w.HandleAll(h)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// wantStatus fails the test unless each task of ids comes to status st.
func wantStatus(t *testing.T, c *queue.Client, st queue.Status, ids ...string) {
	t.Helper()
	for _, id := range ids {
		waitUntil(t, id+" to be "+string(st), func() bool {
			got, err := c.Get(context.Background(), id)
			return err == nil && got.CurrentStatus == st
		})
	}
}

// markCount is how many cascade marks of queue "wf" are stored.
func markCount(t *testing.T, cli *clientv3.Client, ns string) int64 {
	t.Helper()
	g, err := cli.Get(context.Background(), keyspace.MustNew(ns).ChildCascades("wf"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return g.Count
}

func setupIdle(t *testing.T, c *queue.Client, parents ...string) {
	t.Helper()
	if err := c.SetConfig(context.Background(), "idle", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	setupFamily(t, c, parents...)
}

// A parent failed by its first dead child (the default policy) cancels
// its other live children, as a cancel of it does: one running (its
// handler's context ends), two pending; the detached one stays live, and
// the cascade leaves no mark behind.
func TestFailFastCancelsLiveSiblings(t *testing.T) {
	t.Cleanup(queue.SetCascadeRescan(time.Second)) // first: restored after the workers stop
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = func(id string) []task.Child {
		return append([]task.Child{{Queue: "kids", Type: "x"}}, failFastChildren(id)...)
	}
	running, stopped := make(chan struct{}), make(chan struct{})
	runKids(t, cli, ns, func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		if tk.ID == "p.1.0" { // the running sibling
			close(running)
			<-ctx.Done()
			close(stopped)
			return nil, ctx.Err()
		}
		<-running
		return nil, queue.Permanent(errors.New("search backend refused"))
	})
	runParents(t, cli, ns, f)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "p.1.1") {
		t.Fatalf("parent %s (%s); want DEAD naming child p.1.1", got.CurrentStatus, got.LastError)
	}
	wantStatus(t, c, queue.Cancelled, "p.1.0", "p.1.2", "p.1.3")
	select {
	case <-stopped:
	case <-time.After(30 * time.Second):
		t.Fatal("the running sibling's handler never saw its context end")
	}
	if d, err := c.Get(context.Background(), "p.1.4"); err != nil || d.CurrentStatus != queue.Pending {
		t.Fatalf("detached child: %+v (%v); want PENDING", d, err)
	}
	waitUntil(t, "the cascade mark to go", func() bool { return markCount(t, cli, ns) == 0 })
}

// A process SIGKILLed between its cancel of a parent and the cancels of
// the parent's children (the crash point a hook holds it at) leaves the
// cascade mark the cancel wrote: the children stay live while no worker
// of the parent's queue runs, and the first one that starts cancels them
// (the detached one excepted) and removes the mark.
func TestCancelCascadeFinishedAfterKill(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = func(string) []task.Child {
		return []task.Child{{Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x"}, {Queue: "idle", Type: "x", Detached: true}}
	}
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Waiting, "p")
	stop()

	killChildHelperWhenStopped(t, ns, "children-cancel", filepath.Join(t.TempDir(), "log"))
	ctx := context.Background()
	if p, err := c.Get(ctx, "p"); err != nil || p.CurrentStatus != queue.Cancelled {
		t.Fatalf("parent after the kill: %+v (%v); want CANCELLED", p, err)
	}
	if st, err := c.Stats(ctx, "idle"); err != nil || st.Pending != 3 {
		t.Fatalf("children after the kill: %+v (%v); want 3 PENDING (the cascade had not run)", st, err)
	}
	if n := markCount(t, cli, ns); n != 1 {
		t.Fatalf("%d cascade marks after the kill; want 1", n)
	}
	runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Cancelled, "p.1.0", "p.1.1")
	waitUntil(t, "the cascade mark to go", func() bool { return markCount(t, cli, ns) == 0 })
	if d, err := c.Get(ctx, "p.1.2"); err != nil || d.CurrentStatus != queue.Pending {
		t.Fatalf("detached child: %+v (%v); want PENDING", d, err)
	}
}

// A parents' worker SIGKILLed right after it wrote a parent's death (its
// first child failed it), before it cancelled the parent's other
// children: the cascade mark written with the death makes the next
// worker of the parents' queue cancel them.
func TestFailFastCascadeFinishedAfterKill(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	runKids(t, cli, ns, func(context.Context, *queue.Task) ([]byte, error) {
		return nil, queue.Permanent(errors.New("search backend refused"))
	})
	killChildHelperWhenStopped(t, ns, "children-dead", filepath.Join(t.TempDir(), "log"))
	ctx := context.Background()
	if p, err := c.Get(ctx, "p"); err != nil || p.CurrentStatus != queue.Dead {
		t.Fatalf("parent after the kill: %+v (%v); want DEAD", p, err)
	}
	if st, err := c.Stats(ctx, "idle"); err != nil || st.Pending != 3 {
		t.Fatalf("children after the kill: %+v (%v); want 3 PENDING (the cascade had not run)", st, err)
	}
	if n := markCount(t, cli, ns); n != 1 {
		t.Fatalf("%d cascade marks after the kill; want 1", n)
	}
	f := newFamily(0)
	f.children = failFastChildren
	runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Cancelled, "p.1.1", "p.1.2")
	waitUntil(t, "the cascade mark to go", func() bool { return markCount(t, cli, ns) == 0 })
	if d, err := c.Get(ctx, "p.1.3"); err != nil || d.CurrentStatus != queue.Pending {
		t.Fatalf("detached child: %+v (%v); want PENDING", d, err)
	}
}

// A child whose id another task has already (submitted by other means)
// fails the spawn before anything of it is stored: the parent ends DEAD
// with an error naming the child's field and the id, no child is
// submitted and no plan written; the other task is left as it was.
func TestSpawnRefusesAChildIDAnotherTaskHas(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupFamily(t, c, "p")
	ctx := context.Background()
	if _, err := c.Submit(ctx, "kids", []queue.Task{{ID: "p.1.1", Type: "unrelated"}}, nil); err != nil {
		t.Fatal(err)
	}
	f := newFamily(3)
	runParents(t, cli, ns, f)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Dead || !strings.Contains(got.LastError, "children[1].key") || !strings.Contains(got.LastError, "p.1.1") {
		t.Fatalf("parent %s (%s); want DEAD naming children[1].key and the id p.1.1", got.CurrentStatus, got.LastError)
	}
	if st, err := c.Stats(ctx, "kids"); err != nil || st.Total() != 1 {
		t.Fatalf("kids: %+v (%v); want the unrelated task alone", st, err)
	}
	g, err := cli.Get(ctx, keyspace.MustNew(ns).TaskChildren("p"), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 0 {
		t.Fatalf("%d child keys stored under the parent (%v); want none", g.Count, err)
	}
	if o, err := c.Get(ctx, "p.1.1"); err != nil || o.Parent != "" || o.Type != "unrelated" {
		t.Fatalf("the other task: %+v (%v); want it as submitted", o, err)
	}
}
