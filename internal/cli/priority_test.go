package cli_test

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
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
	ids := runOrder(t, ns, "p")
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
	checkPriorityOrder(t, order, []string{"high", "mid", "low"})
}

// checkPriorityOrder checks that tasks of lower priority (later in ranks)
// ran ahead of higher ones only in the anti-starvation turns: at most one
// claim in eight (plus one) before the last task of each higher priority.
func checkPriorityOrder(t *testing.T, order, ranks []string) {
	t.Helper()
	for r, prio := range ranks[:len(ranks)-1] {
		last := -1
		for i, p := range order {
			if p == prio {
				last = i
			}
		}
		jumped := 0
		for _, p := range order[:last+1] {
			if slices.Index(ranks, p) > r {
				jumped++
			}
		}
		if jumped > (last+1)/8+1 {
			t.Fatalf("%d lower-priority tasks ran before the last %s task (position %d): more than one claim in eight: %v", jumped, prio, last+1, order)
		}
	}
}

// TestFIFOQueue: in a queue set to FIFO, tasks of equal priority run
// exactly in submission order, and priorities still go first.
func TestFIFOQueue(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "queues", "set", "f", "--fifo")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	for i := range 3 { // three submissions per priority, a moment apart
		submitN(t, ns, "f", fmt.Sprintf("low%d", i), 6, `,"metadata":{"priority":0}`)
		submitN(t, ns, "f", fmt.Sprintf("high%d", i), 4, `,"metadata":{"priority":5}`)
	}
	ids := runOrder(t, ns, "f")
	if len(ids) != 30 {
		t.Fatalf("%d tasks ran, want 30", len(ids))
	}
	t.Logf("order: %v", ids)
	// Submission order within a priority: batch 0 before 1 before 2, and
	// ids in order within a batch.
	last := map[string]string{}
	var order []string
	for _, id := range ids {
		prio := strings.TrimRight(strings.SplitN(id, "-", 2)[0], "0123456789")
		if id < last[prio] {
			t.Fatalf("%s ran after %s: not in submission order", id, last[prio])
		}
		last[prio] = id
		order = append(order, prio)
	}
	checkPriorityOrder(t, order, []string{"high", "low"})
}

// runOrder drains queue q with one worker running one task at a time and
// returns the ids of the tasks in the order they ran.
func runOrder(t *testing.T, ns, q string) []string {
	t.Helper()
	log := filepath.Join(t.TempDir(), "order")
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", q, "--concurrency", "1", "--drain",
		"--handler", `exec:t=$(sed 's/.*"task_id":"\([a-z0-9-]*\)".*/\1/'); echo "$t" >> `+log)...)
	if code := w.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("worker exit %d: %s", code, w.stderr.String())
	}
	b, err := os.ReadFile(log)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}
