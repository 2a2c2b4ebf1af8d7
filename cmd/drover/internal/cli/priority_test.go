package cli_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestFIFOAndPriorityFlags: the command line sets a queue FIFO and submits
// with a priority; the order they give is tested next to the queue's code
// (queue.TestPriorityOrder, queue.TestFIFOQueue). One worker drains a FIFO
// queue with a high-priority task submitted last: it runs first.
func TestFIFOAndPriorityFlags(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "queues", "set", "f", "--fifo", "--json")...); r.code != 0 || !strings.Contains(r.stdout, `"fifo":true`) {
		t.Fatalf("queues set --fifo: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "queues", "get", "f", "--json")...); !strings.Contains(r.stdout, `"fifo":true`) {
		t.Fatalf("queues get: %q", r.stdout)
	}
	for _, args := range [][]string{{"--id", "a"}, {"--id", "b"}, {"--id", "c", "--priority", "9"}} {
		if r := drover(t, append(append(etcdFlags(ns), "submit", "--queue", "f", "--type", "t"), args...)...); r.code != 0 {
			t.Fatalf("submit %v: %d %q", args, r.code, r.stderr)
		}
	}
	log := t.TempDir() + "/order"
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "f", "--concurrency", "1", "--drain",
		"--handler", `exec:t=$(sed 's/.*"task_id":"\([a-z]*\)".*/\1/'); echo "$t" >> `+log)...)
	if code := w.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("worker exit %d: %s", code, w.stderr.String())
	}
	b, err := os.ReadFile(log)
	if err != nil || strings.Join(strings.Fields(string(b)), " ") != "c a b" {
		t.Fatalf("order %q (%v), want c a b", b, err)
	}
}
