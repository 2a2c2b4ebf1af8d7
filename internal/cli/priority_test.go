package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/etcdtest"
)

// TestPriorityOrder: 20 low, 5 mid and 10 high priority tasks run one at a
// time. High ones go first (seven claims in eight take the highest level;
// the eighth serves a lower one so nothing starves), then mid, then low.
func TestPriorityOrder(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "p", "low", 20, `,"metadata":{"priority":0}`)
	submitN(t, ns, "p", "mid", 5, `,"metadata":{"priority":3}`)
	submitN(t, ns, "p", "high", 10, `,"metadata":{"priority":5}`)
	log := filepath.Join(t.TempDir(), "order")
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "p", "--concurrency", "1", "--drain",
		"--handler", `exec:t=$(sed 's/.*"task_id":"\([a-z0-9-]*\)".*/\1/'); echo "$t" >> `+log)...)
	if code := w.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("worker exit %d: %s", code, w.stderr.String())
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	ids := strings.Fields(string(b))
	if len(ids) != 35 {
		t.Fatalf("%d tasks ran, want 35", len(ids))
	}
	// Among equal priorities the order is only approximately FIFO across
	// shards (docs/flow.md), so it is not asserted here.
	var order []string
	for _, id := range ids {
		typ, _, _ := strings.Cut(id, "-")
		order = append(order, typ)
	}
	t.Logf("order: %v", order)
	rank := map[string]int{"high": 0, "mid": 1, "low": 2}
	// Every task that jumps ahead of a higher-priority one must be an
	// eighth claim (the anti-starvation turn).
	for i, typ := range order {
		for _, later := range order[i+1:] {
			if rank[later] < rank[typ] && (i+1)%8 != 0 {
				t.Fatalf("task %d (%s) ran before a %s task, and it was not an eighth claim: %v", i+1, typ, later, order)
			}
		}
	}
	lowerEarly := 0
	for _, typ := range order[:10] {
		if typ != "high" {
			lowerEarly++
		}
	}
	if lowerEarly > 1 {
		t.Fatalf("%d of the first 10 were not high: %v", lowerEarly, order)
	}
}
