package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestClaimTakesSeveralSmallSegmentsAtOnce: six segments of two tasks
// each (delayed tasks due over a spread of times fall due so) are taken
// by one claim of 12 in one attempt, not one segment per attempt, and
// each task once.
func TestClaimTakesSeveralSmallSegmentsAtOnce(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	for s := range 6 {
		ts := []queue.Task{{ID: fmt.Sprintf("s%d-a", s), Type: "x"}, {ID: fmt.Sprintf("s%d-b", s), Type: "x"}}
		if res, err := c.Submit(ctx, "small", ts, nil); err != nil || res.Submitted != 2 {
			t.Fatalf("submit segment %d: %+v %v", s, res, err)
		}
	}
	l := grantLease(t, cli, 30*time.Second)
	before := queue.ClaimAttempts(c)
	got, err := c.Claim(ctx, "small", queue.ClaimRequest{Lease: l, Worker: "w", Max: 12})
	if err != nil || len(got) != 12 {
		t.Fatalf("claim with max 12 of 12 tasks in 6 segments: %d tasks, err %v", len(got), err)
	}
	if n := queue.ClaimAttempts(c) - before; n != 1 {
		t.Fatalf("the claim made %d attempts, want 1 (every segment in one request)", n)
	}
	seen := map[string]bool{}
	for _, tk := range got {
		if seen[tk.ID] || tk.CurrentStatus != queue.Running || tk.Token == 0 {
			t.Fatalf("claimed twice or not running: %+v", tk)
		}
		seen[tk.ID] = true
	}
	// Each is held: outcomes are accepted, and nothing is left to claim.
	for _, tk := range got {
		if _, err := c.Ack(ctx, queue.Held{Queue: "small", ID: tk.ID, Token: tk.Token, Lease: l.ID()}, nil); err != nil {
			t.Fatalf("ack %s: %v", tk.ID, err)
		}
	}
	if more, err := c.Claim(ctx, "small", queue.ClaimRequest{Lease: grantLease(t, cli, 30*time.Second), Worker: "w2", Max: 12}); err != nil || len(more) != 0 {
		t.Fatalf("a second claim: %d tasks, err %v; want none", len(more), err)
	}
	if st, _ := c.Stats(ctx, "small"); st.Succeeded != 12 {
		t.Fatalf("stats %+v, want 12 succeeded", st)
	}
}
