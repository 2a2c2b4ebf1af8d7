package queue_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
)

// A parent cancelled between its spawn's checkpoint and its children's
// submission has its cascade find no child; the submission that follows,
// by the worker that lost its claim, stores none (the cancel sealed the
// parent's children), so that a crash after it cannot leave children
// live: none exists at all.
func TestCancelBeforeChildSubmitStoresNoChild(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = idleChildren
	var once sync.Once
	var cancelErr error
	queue.SetChildHooks(func(parent string) {
		once.Do(func() { _, cancelErr = c.Cancel(context.Background(), parent) })
	}, nil, nil)
	t.Cleanup(func() { queue.SetChildHooks(nil, nil, nil) })
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Cancelled, "p")
	waitUntil(t, "the cancel", func() bool { return countPrefix(t, cli, keyspace.MustNew(ns).ChildSealed("p")) == 1 })
	stop()
	if cancelErr != nil {
		t.Fatal(cancelErr)
	}
	for _, id := range []string{"p.1.0", "p.1.1"} {
		if got, err := c.Get(context.Background(), id); !errors.Is(err, queue.ErrNotFound) {
			t.Fatalf("child %s after its parent's cancel: %+v (%v); want none stored", id, got, err)
		}
	}
	if n := countPrefix(t, cli, keyspace.MustNew(ns).TaskIndex("p.")); n != 0 {
		t.Fatalf("%d index keys of p's children; want 0", n)
	}
	// A submission of them now is refused whole, naming why.
	_, err := c.Submit(context.Background(), "idle", []queue.Task{{ID: "p.1.0", Type: "x", Parent: "p", ParentStep: 1, ParentQueue: "wf"}}, nil)
	if !errors.Is(err, queue.ErrParentEnded) {
		t.Fatalf("a late submission of p's child: %v; want ErrParentEnded", err)
	}
}

// Two parents whose children come out with one id, submitted at once
// from two clients: the submission's transaction requires the id new, so
// exactly one parent's child is stored, and the other's submission is
// refused as a conflict (the id is another parent's child), storing
// nothing.
func TestTwoParentsRaceForOneChildID(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c1, cli := newClient(t, ns)
	c2, _ := newClient(t, ns)
	ctx := context.Background()
	for round := range 20 {
		id := "kid-" + string(rune('a'+round))
		var wg sync.WaitGroup
		res := make([]queue.SubmitResult, 2)
		errs := make([]error, 2)
		for k, c := range []*queue.Client{c1, c2} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				parent := []string{"pa", "pb"}[k]
				res[k], errs[k] = c.Submit(ctx, "idle", []queue.Task{{ID: id, Type: "x", Parent: parent, ParentStep: 1, ParentQueue: "wf"}}, nil)
			}()
		}
		wg.Wait()
		if errs[0] != nil || errs[1] != nil {
			t.Fatalf("round %d: %v, %v", round, errs[0], errs[1])
		}
		won := -1
		for k := range res {
			switch {
			case res[k].Submitted == 1 && len(res[k].Rejected) == 0 && won == -1:
				won = k
			case res[k].Submitted == 0 && res[k].Duplicates == 0 && len(res[k].Rejected) == 1:
			default:
				t.Fatalf("round %d: submissions %+v; want one stored, one refused", round, res)
			}
		}
		if won == -1 {
			t.Fatalf("round %d: neither parent's child was stored: %+v", round, res)
		}
		got, err := c1.Get(ctx, id)
		if err != nil || got.Parent != []string{"pa", "pb"}[won] {
			t.Fatalf("round %d: stored %+v (%v); want the child of the winner", round, got, err)
		}
		if n := countPrefix(t, cli, keyspace.MustNew(ns).TaskIndex(id)); n != 1 {
			t.Fatalf("round %d: %d index keys for %s; want 1", round, n, id)
		}
	}
	if n := countPrefix(t, cli, keyspace.MustNew(ns).Segments("idle")); n != 20 {
		t.Fatalf("%d segments in idle; want 20, one a round", n)
	}
}
