package queue

import (
	"context"
	"errors"
	"testing"
)

// pauseRevOf is the revision queue q's pause key was written at, as c
// reads it.
func pauseRevOf(t *testing.T, c *Client, q string) int64 {
	t.Helper()
	g, err := c.cli.Get(context.Background(), c.keys.QueuePaused(q))
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("pause key: %v %v", g, err)
	}
	return g.Kvs[0].ModRevision
}

// TestPauseKnownClaimRevision: a claim that does not try because its
// Client knows the queue paused returns the pause's revision, from which
// its caller's wait replays a resume made since.
func TestPauseKnownClaimRevision(t *testing.T) {
	e := newReviewEnv(t).space(t)
	e.submitSegment(t, "k", 4)
	w := e.worker(t, WorkerConfig{Concurrency: 4})
	ctx := context.Background()
	if _, err := w.client.Pause(ctx, reviewQueue); err != nil {
		t.Fatal(err)
	}
	claims, rev, _, err := w.sched.claim(ctx, 0, 4)
	if err != nil || len(claims) != 0 {
		t.Fatalf("claim of a paused queue: %d claims, %v", len(claims), err)
	}
	if want := pauseRevOf(t, e.c, reviewQueue); rev != want {
		t.Fatalf("claim of a known paused queue returned revision %d, want the pause's %d", rev, want)
	}
}

// TestPauseRefusalKeepsLost: a claim the pause fence refuses keeps the
// dead workers' tasks and segments it was to take first: they go first
// after the resume.
func TestPauseRefusalKeepsLost(t *testing.T) {
	e := newReviewEnv(t).space(t)
	ctx := context.Background()
	// A task with a record of its own: dead, then requeued.
	e.submitSegment(t, "r", 1)
	w0 := e.worker(t, WorkerConfig{Concurrency: 1, Drain: true})
	w0.HandleAll(func(ctx context.Context, tk *Task) ([]byte, error) { return nil, Permanent(errors.New("no")) })
	if err := w0.Run(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := e.c.Requeue(ctx, reviewQueue, []string{"r-000"}, nil); err != nil || n != 1 {
		t.Fatalf("requeue: %d %v", n, err)
	}
	e.submitSegment(t, "s", 4)

	w := e.worker(t, WorkerConfig{Concurrency: 4})
	// Paused by another Client: the worker's claims learn it from the fence.
	if _, err := e.c.Pause(ctx, reviewQueue); err != nil {
		t.Fatal(err)
	}
	w.sched.lost.add([]string{"r-000"})
	claims, rev, _, err := w.sched.claim(ctx, 0, 4)
	if err != nil || len(claims) != 0 {
		t.Fatalf("claim refused by the pause: %d claims, %v", len(claims), err)
	}
	if got := w.sched.lost.first(); got != "r-000" {
		t.Fatalf("lost task after a refused claim: %q, want r-000", got)
	}
	if want := pauseRevOf(t, e.c, reviewQueue); rev != want {
		t.Fatalf("refused claim returned revision %d, want the pause's %d", rev, want)
	}

	if _, err := e.c.Resume(ctx, reviewQueue); err != nil {
		t.Fatal(err)
	}
	if _, err := w.client.Paused(ctx, reviewQueue); err != nil { // as its wait for the resume would learn it
		t.Fatal(err)
	}
	claims, _, _, err = w.sched.claim(ctx, 0, 4)
	if err != nil || len(claims) == 0 || claims[0].task.ID != "r-000" {
		t.Fatalf("first claim after the resume: %d claims, %v; want r-000 first", len(claims), err)
	}

	// A segment a dead worker's run left tasks in, in a queue without
	// tasks of records of their own (those go first).
	e2 := e.space(t)
	seg := e2.submitSegment(t, "s", 4)
	w2 := e2.worker(t, WorkerConfig{Concurrency: 4})
	if _, err := e2.c.Pause(ctx, reviewQueue); err != nil {
		t.Fatal(err)
	}
	w2.sched.lostSegs.add([]string{seg})
	claims, _, _, err = w2.sched.claim(ctx, 0, 4)
	if err != nil || len(claims) != 0 {
		t.Fatalf("segment claim refused by the pause: %d claims, %v", len(claims), err)
	}
	if got := w2.sched.lostSegs.first(); got != seg {
		t.Fatalf("lost segment after a refused claim: %q, want %s", got, seg)
	}
}
