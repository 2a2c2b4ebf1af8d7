package queue

import (
	"context"
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
