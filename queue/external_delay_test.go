package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestExternalClaimWakesForDelayedTask: an external claim already waiting
// on an empty queue when a delayed task is submitted (by another process)
// claims it once it falls due, not when its own wait ends: the delayed
// segment's due key wakes it, as a scheduled retry does. The wait is a
// minute, so a claim that sleeps through the due time fails the test's
// 45 s bound however loaded the machine.
func TestExternalClaimWakesForDelayedTask(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	waiter, cli := newClient(t, ns)
	other, _ := newClient(t, ns) // another process: its own client state
	lw := grantLease(t, cli, 120*time.Second)
	if got, err := waiter.Claim(ctx, "later", queue.ClaimRequest{Lease: lw, Worker: "waiter", Max: 1}); err != nil || len(got) != 0 {
		t.Fatalf("first claim: %d, %v", len(got), err)
	}
	done := make(chan []*queue.Task, 1)
	go func() {
		got, err := waiter.Claim(ctx, "later", queue.ClaimRequest{Lease: lw, Worker: "waiter", Max: 1, Wait: time.Minute})
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	time.Sleep(50 * time.Millisecond) // the claim waits
	runAt := time.Now().Add(200 * time.Millisecond)
	if _, err := other.Submit(ctx, "later", []queue.Task{{ID: "d1", Type: "t", RunAt: runAt}}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-done:
		if len(got) != 1 || got[0].ID != "d1" {
			t.Fatalf("the waiting claim got %d tasks", len(got))
		}
		if now := time.Now(); now.Before(runAt) {
			t.Fatalf("claimed %s before its run_at", runAt.Sub(now))
		}
	case <-time.After(45 * time.Second):
		t.Fatal("the waiting claim slept through the delayed task's due time")
	}
}
