package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestExternalClaimLevelTurns: external claims, each under a session of
// its own, serve lower priority levels in turn, as a Go worker does: with
// three levels pending, the lowest is served before the upper ones are
// empty.
func TestExternalClaimLevelTurns(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	for _, lv := range []struct {
		name string
		prio int
	}{{"p3", 3}, {"p2", 2}, {"p1", 1}} {
		tasks := make([]queue.Task, 40)
		for i := range tasks {
			tasks[i] = queue.Task{ID: fmt.Sprintf("%s-%d", lv.name, i), Type: "x", Metadata: queue.Metadata{Priority: lv.prio}}
		}
		if _, err := c.Submit(ctx, "lv", tasks, nil); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]int{}
	for i := 0; i < 48; i++ {
		l := grantLease(t, cli, 30*time.Second)
		tasks, err := c.Claim(ctx, "lv", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		for _, tk := range tasks {
			p, _, _ := strings.Cut(tk.ID, "-")
			got[p]++
		}
	}
	if got["p1"] == 0 || got["p3"] < 30 {
		t.Fatalf("48 claims took %v: the lowest level must get turns, the top most claims", got)
	}
}

// TestExternalClaimWakesForRetry: a claim waiting on an empty queue gets
// a task that another process's worker failed, soon after its short
// backoff, not at the end of its wait (a retry scheduled within the
// claimer's promotion interval used to wait out the whole long poll).
func TestExternalClaimWakesForRetry(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	waiter, cli := newClient(t, ns)
	other, _ := newClient(t, ns) // another process: its own client state
	submitN(t, other, "rw", 1, func(tk *queue.Task) {
		tk.BackoffBase, tk.BackoffMax = queue.Duration(50*time.Millisecond), queue.Duration(80*time.Millisecond)
	})
	lo := grantLease(t, cli, 30*time.Second)
	tasks, err := other.Claim(ctx, "rw", queue.ClaimRequest{Lease: lo, Worker: "other", Max: 1})
	if err != nil || len(tasks) != 1 {
		t.Fatalf("claim: %d, %v", len(tasks), err)
	}
	lw := grantLease(t, cli, 30*time.Second)
	// The waiter checks for due retries now, finds none, and waits.
	if got, err := waiter.Claim(ctx, "rw", queue.ClaimRequest{Lease: lw, Worker: "waiter", Max: 1}); err != nil || len(got) != 0 {
		t.Fatalf("first claim: %d, %v", len(got), err)
	}
	done := make(chan []*queue.Task, 1)
	start := time.Now()
	go func() {
		got, err := waiter.Claim(ctx, "rw", queue.ClaimRequest{Lease: lw, Worker: "waiter", Max: 1, Wait: 4 * time.Second})
		if err != nil {
			t.Error(err)
		}
		done <- got
	}()
	time.Sleep(30 * time.Millisecond)
	if _, err := other.Fail(ctx, held("rw", tasks[0], lo), "transient", false); err != nil {
		t.Fatal(err)
	}
	got := <-done
	if len(got) != 1 || got[0].Attempt != 2 {
		t.Fatalf("the waiting claim got %d tasks", len(got))
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the retry (backoff under 80 ms) was claimed %s after the wait began", d)
	}
}
