package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestPauseStaleShortPolls: a Client that learned of a pause from a
// refused claim, and whose queue another Client resumed, claims again on
// its next claim without a wait (Wait 0), however long after: its shared
// watch closed meanwhile, so no wait saw the resume for it.
func TestPauseStaleShortPolls(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	srvC, cliA := newClient(t, ns)
	queue.SetWatchLinger(srvC, 50*time.Millisecond)
	admin, _ := newClient(t, ns)
	ctx := context.Background()
	submitN(t, admin, "sp", 5, nil)
	if _, err := admin.Pause(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cliA, 60*time.Second)
	req := queue.ClaimRequest{Lease: l, Worker: "poller", Max: 1}
	if ts, err := srvC.Claim(ctx, "sp", req); err != nil || len(ts) != 0 {
		t.Fatalf("claim while paused: %v %v", ts, err)
	}
	if _, err := admin.Resume(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		// Each poll once the Client's watch of the queue has closed.
		waitFor(t, "the shared watch closes", func() bool { return queue.LiveWatches(srvC) == 0 })
		ts, err := srvC.Claim(ctx, "sp", req)
		if err != nil {
			t.Fatal(err)
		}
		if len(ts) != 1 {
			st, _ := admin.Stats(ctx, "sp")
			t.Fatalf("poll %d of a resumed queue claimed %d tasks: %+v", i, len(ts), st)
		}
	}
	// Still paused: a claim without a wait answers nothing, at once.
	if _, err := admin.Pause(ctx, "sp"); err != nil {
		t.Fatal(err)
	}
	if ts, err := srvC.Claim(ctx, "sp", req); err != nil || len(ts) != 0 {
		t.Fatalf("claim while paused again: %v %v", ts, err)
	}
}
