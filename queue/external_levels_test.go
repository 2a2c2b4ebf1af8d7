package queue_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/etcdtest"
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
