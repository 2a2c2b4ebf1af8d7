package cli_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestTasksRequeueScheduled: `drover tasks requeue --status SCHEDULED`
// makes a scheduled task PENDING at once; a bad status is refused (exit 2)
// naming the flag.
func TestTasksRequeueScheduled(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "later", "--type", "x", "--id", "r-1", "--in", "1h")...); r.code != 0 {
		t.Fatalf("submit: %d %q", r.code, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "requeue", "--queue", "later", "--status", "SCHEDULED", "r-1", "--json")...); r.code != 0 || !strings.Contains(r.stdout, `"count":1`) {
		t.Fatalf("requeue: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "get", "r-1", "--json")...); !strings.Contains(r.stdout, `"current_status":"PENDING"`) || !strings.Contains(r.stdout, `"SCHEDULED"`) {
		t.Fatalf("the requeued task: %q, want PENDING with SCHEDULED in its history", r.stdout)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "requeue", "--queue", "later", "--status", "PENDING", "--all")...); r.code != 2 || !strings.Contains(r.stderr, "--status") {
		t.Fatalf("requeue of PENDING: %d %q, want exit 2 naming --status", r.code, r.stderr)
	}
}
