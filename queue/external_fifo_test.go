package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestExternalClaimFIFO: in a FIFO queue, one session's successive claims
// of one task each all find a task while tasks are pending, in submission
// order (a session's remembered segment must not make a claim skip the
// queue's open segments).
func TestExternalClaimFIFO(t *testing.T) {
	ctx := context.Background()
	c, cli := newClient(t, etcdtest.Namespace(t))
	if err := c.SetConfig(ctx, "ff", queue.Config{FIFO: true}); err != nil {
		t.Fatal(err)
	}
	submitN(t, c, "ff", 40, nil)
	l := grantLease(t, cli, 30*time.Second)
	start := time.Now()
	for i := 0; i < 40; i++ {
		tasks, err := c.Claim(ctx, "ff", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
		if err != nil {
			t.Fatal(err)
		}
		if len(tasks) != 1 {
			t.Fatalf("claim %d of a FIFO queue with %d tasks pending found %d", i, 40-i, len(tasks))
		}
		if _, err := c.Ack(ctx, held("ff", tasks[0], l), nil); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("40 claims took %s", d)
	}
}
