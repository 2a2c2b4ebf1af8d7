package queue

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Segments opened between a worker's waits. A claim's read of the open
// segments is bounded by the open window (pick.go): it starts at the
// oldest open segment found before, its head. A segment named before the
// head, whose submission was named first and committed later (three
// parents' children submitted at once, one of them held up; or a
// submitter's clock behind), lies outside every such read; the window
// learns of it from the segment's watch event (openWindow.created). The
// events a claimer saw were only those of its waits, which start at the
// revision of the claim before them: a segment opened while the worker
// was claiming (or waiting for a free slot), not waiting, was never told
// to the window, and the worker, finding nothing, waited for its 30 s
// safety net (the children that stayed PENDING 30 s in the workflow chaos
// tests, TestWorkflowChildrenClaimedPromptly).

// waitBound is how long the tests below let a wait take to end on a watch
// event: generous, and far under the wait's 30 s safety net, so a wait that
// ends within it was woken by the watch.
const waitBound = 10 * time.Second

// TestSegmentOpenedBetweenClaimsWakesTheWait: a segment named before the
// window's head and opened between two claims (no wait open to see it)
// wakes the wait that follows the second claim, whose read did not reach
// it, and the claim after that takes its task.
func TestSegmentOpenedBetweenClaimsWakesTheWait(t *testing.T) {
	e := newReviewEnv(t).space(t)
	ctx := context.Background()
	w := e.worker(t, WorkerConfig{Concurrency: 4})
	// A task claimed and kept running: its segment stays open, the oldest,
	// the window's head.
	e.submitSegment(t, "a", 1)
	first, _, _, err := w.sched.claim(ctx, 0, 4)
	if err != nil || len(first) != 1 {
		t.Fatalf("first claim: %d tasks, %v; want a-000", len(first), err)
	}
	// Between two claims, with no wait open: a segment named a second
	// before A's (its submission named it, then was held up).
	late, err := NewClient(e.cli, e.ns)
	if err != nil {
		t.Fatal(err)
	}
	late.now = func() time.Time { return time.Now().Add(-time.Second) }
	if _, err := late.Submit(ctx, reviewQueue, []Task{{ID: "late", Type: "work"}}, nil); err != nil {
		t.Fatal(err)
	}
	// Claims as the worker's loop makes them, until one finds nothing and
	// is not contended: the loop then waits for work after its read.
	var rev int64
	for i := 0; ; i++ {
		claims, r, contended, err := w.sched.claim(ctx, 0, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(claims) > 0 {
			t.Logf("claim %d took %s without a wait (its read reached it)", i, claims[0].task.ID)
			return
		}
		if !contended {
			rev = r
			break
		}
		if i == 20 {
			t.Fatal("20 claims in a row were contended")
		}
	}
	woke := make(chan struct{})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		w.waitForWork(wctx, context.Background(), rev, nil, true, 0)
		close(woke)
	}()
	select {
	case <-woke:
	case <-time.After(waitBound):
		cancel()
		<-woke
		t.Fatalf("the wait after a claim that found nothing was not woken within %s by the segment opened before it, "+
			"named before the window's head (it would end at its 30 s safety net)", waitBound)
	}
	claims, _, _, err := w.sched.claim(ctx, 0, 4)
	if err != nil || len(claims) != 1 || claims[0].task.ID != "late" {
		ids := make([]string, len(claims))
		for i, c := range claims {
			ids[i] = c.task.ID
		}
		t.Fatalf("the claim after the wait took %v (%v); want [late]", ids, err)
	}
}

// TestWorkerClaimsSegmentsOpenedWhileItsSlotsAreFull: the same through
// Run. A worker of two slots runs two tasks that hold them, so neither of
// its claim loops waits on the watch (both wait for a slot); meanwhile
// three segments are opened, named in one order and committed in
// another, as three parents' children submitted at once can be. When the
// tasks end, every one of them is claimed within waitBound, not at the
// worker's 30 s safety net.
func TestWorkerClaimsSegmentsOpenedWhileItsSlotsAreFull(t *testing.T) {
	e := newReviewEnv(t).space(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w := e.worker(t, WorkerConfig{Concurrency: 2})
	started := make(chan string, 16)
	release := make(chan struct{})
	w.HandleAll(func(_ context.Context, tk *Task) ([]byte, error) {
		started <- tk.ID
		if tk.ID == "hold-0" || tk.ID == "hold-1" {
			<-release
		}
		return nil, nil
	})
	ran := make(chan struct{})
	go func() { _ = w.Run(ctx); close(ran) }()
	defer func() { cancel(); <-ran }()
	// hold-1 is submitted after hold-0 is claimed: the segments, one task
	// each, are the oldest open ones while they run.
	for i := range 2 {
		id := fmt.Sprintf("hold-%d", i)
		if _, err := e.c.Submit(ctx, reviewQueue, []Task{{ID: id, Type: "work"}}, nil); err != nil {
			t.Fatal(err)
		}
		expectStarted(t, started, id)
	}
	// Three segments named before the holds' (their submissions were
	// named, then held up), committed newest name first.
	for i := range 3 {
		sub, err := NewClient(e.cli, e.ns)
		if err != nil {
			t.Fatal(err)
		}
		behind := time.Duration(i+1) * 300 * time.Millisecond
		sub.now = func() time.Time { return time.Now().Add(-behind) }
		if _, err := sub.Submit(ctx, reviewQueue, []Task{{ID: fmt.Sprintf("late-%d", i), Type: "work"}}, nil); err != nil {
			t.Fatal(err)
		}
	}
	close(release)
	seen := map[string]bool{}
	deadline := time.After(waitBound)
	for len(seen) < 3 {
		select {
		case id := <-started:
			seen[id] = true
		case <-deadline:
			t.Fatalf("started %v of late-0..2 within %s of the holds' end; the rest waited for the worker's 30 s safety net", seen, waitBound)
		}
	}
}

// expectStarted waits for task id to start.
func expectStarted(t *testing.T, started <-chan string, id string) {
	t.Helper()
	select {
	case got := <-started:
		if got != id {
			t.Fatalf("started %s, want %s", got, id)
		}
	case <-time.After(waitBound):
		t.Fatalf("%s did not start within %s", id, waitBound)
	}
}
