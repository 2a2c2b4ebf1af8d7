package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestSubmitLater: --in and --at submit SCHEDULED tasks (stats, list,
// get), a JSONL line's run_at or delay counts, cancel --status SCHEDULED
// takes them, and bad values exit 2 naming the flag with nothing stored.
func TestSubmitLater(t *testing.T) {
	ns := etcdtest.Namespace(t)
	run := func(stdin string, args ...string) result {
		t.Helper()
		return droverIn(t, []byte(stdin), append(etcdFlags(ns), args...)...)
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--in", "-5m"}, "--in"},
		{[]string{"--at", "tomorrow"}, "--at"},
		{[]string{"--in", "5m", "--at", "2026-12-01T09:00:00Z"}, "--in or --at"},
	} {
		r := run("", append([]string{"submit", "--queue", "later", "--type", "x"}, bad.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, bad.want) {
			t.Fatalf("submit %v: exit %d %q, want exit 2 naming %s", bad.args, r.code, r.stderr, bad.want)
		}
	}
	r := run(`{"task_id":"f1","task_type":"x","run_at":"not a time"}`+"\n", "submit", "--queue", "later", "--file", "-")
	if r.code != 65 || !strings.Contains(r.stderr, "run_at") {
		t.Fatalf("a line with a bad run_at: exit %d %q, want 65 naming run_at", r.code, r.stderr)
	}
	if r := run("", "tasks", "stats", "--queue", "later", "--json"); r.code == 0 {
		t.Fatalf("bad input stored something: the queue exists: %q", r.stdout)
	}
	if r := run("", "submit", "--queue", "later", "--type", "x", "--id", "in1", "--in", "1h"); r.code != 0 {
		t.Fatalf("submit --in: exit %d %q", r.code, r.stderr)
	}
	lines := `{"task_id":"f2","task_type":"x","delay":"2h"}` + "\n" + `{"task_id":"f3","task_type":"x"}` + "\n"
	if r := run(lines, "submit", "--queue", "later", "--file", "-", "--at", "2099-01-01T00:00:00Z"); r.code != 0 {
		t.Fatalf("submit --file --at: exit %d %q", r.code, r.stderr)
	}
	if r := run("", "tasks", "stats", "--queue", "later", "--json"); !strings.Contains(r.stdout, `"scheduled":3`) || !strings.Contains(r.stdout, `"pending":0`) {
		t.Fatalf("stats %q, want 3 scheduled", r.stdout)
	}
	r = run("", "tasks", "list", "--queue", "later", "--status", "scheduled", "--json")
	var page struct {
		Tasks []struct {
			ID          string `json:"task_id"`
			Status      string `json:"current_status"`
			ScheduledAt string `json:"scheduled_at"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Tasks) != 3 {
		t.Fatalf("list SCHEDULED: %q (%v)", r.stdout, err)
	}
	order := []string{page.Tasks[0].ID, page.Tasks[1].ID, page.Tasks[2].ID}
	if strings.Join(order, ",") != "in1,f2,f3" || page.Tasks[2].ScheduledAt != "2099-01-01T00:00:00Z" || page.Tasks[0].Status != "SCHEDULED" {
		t.Fatalf("list SCHEDULED: %+v, want in1, f2, f3 in due order", page.Tasks)
	}
	if r := run("", "tasks", "get", "f3"); !strings.Contains(r.stdout, "runs at:") {
		t.Fatalf("get f3: %q, want its due time", r.stdout)
	}
	if r := run("", "tasks", "cancel", "--queue", "later", "--status", "SCHEDULED", "--all"); r.code != 0 || !strings.Contains(r.stdout, "cancelled 3") {
		t.Fatalf("cancel --status SCHEDULED --all: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
}
