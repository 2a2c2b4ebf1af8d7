package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// writeTasks writes n tasks of type typ with ids prefix-00000... as a JSONL
// file and returns its path.
func writeTasks(t *testing.T, prefix, typ string, n int) string {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "{\"task_id\":\"%s-%05d\",\"task_type\":\"%s\"}\n", prefix, i, typ)
	}
	file := filepath.Join(t.TempDir(), prefix+".jsonl")
	if err := os.WriteFile(file, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

type pageOut struct {
	Tasks []struct {
		ID     string          `json:"task_id"`
		Status string          `json:"current_status"`
		Result json.RawMessage `json:"result"`
	} `json:"tasks"`
	Next string `json:"next"`
}

// TestListPagesThrough1280Tasks: tasks list and dlq list failed past 42
// tasks (three reads a task in one request, etcd allows 128); now they list
// 1,000 at once and page on with --after.
func TestListPagesThrough1280Tasks(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "r43", "--file", writeTasks(t, "r43", "x", 1280))...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "list", "--queue", "r43", "--status", "PENDING")...); r.code != 0 ||
		strings.Count(r.stdout, "PENDING") != 100 || !strings.Contains(r.stderr, "more: drover tasks list --queue r43 --status PENDING --limit 100 --after ") {
		t.Fatalf("default page: exit %d, %d rows, stderr %q", r.code, strings.Count(r.stdout, "PENDING"), r.stderr)
	}
	seen := map[string]bool{}
	after := ""
	for pages := 1; ; pages++ {
		args := append(etcdFlags(ns), "tasks", "list", "--queue", "r43", "--status", "pending", "--limit", "1000", "--json")
		if after != "" {
			args = append(args, "--after", after)
		}
		r := drover(t, args...)
		var p pageOut
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &p) != nil {
			t.Fatalf("page %d: exit %d, %q %q", pages, r.code, r.stdout, r.stderr)
		}
		for _, task := range p.Tasks {
			if seen[task.ID] || task.Status != "PENDING" {
				t.Fatalf("page %d: %s twice or %s", pages, task.ID, task.Status)
			}
			seen[task.ID] = true
		}
		if p.Next == "" {
			if pages != 2 || len(seen) != 1280 {
				t.Fatalf("%d pages, %d tasks; want 2 pages, 1280 tasks", pages, len(seen))
			}
			break
		}
		after = p.Next
	}
	for _, bad := range [][]string{{"--limit", "-5"}, {"--limit", "1001"}, {"--after", "x\x01y"}} {
		r := drover(t, append(append(etcdFlags(ns), "tasks", "list", "--queue", "r43"), bad...)...)
		if r.code != 2 || !strings.Contains(r.stderr, bad[0]) {
			t.Fatalf("%v: exit %d, %q", bad, r.code, r.stderr)
		}
	}
}

// TestSubmitConflictingIDs: a task id taken in another queue, or in the
// same queue with other content, is rejected with its line (exit 65); the
// same task again is a duplicate (exit 0).
func TestSubmitConflictingIDs(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	job := filepath.Join(dir, "job.jsonl")
	if err := os.WriteFile(job, []byte(`{"task_id":"job-1","task_type":"x","parameters":{"a":1}}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "qa", "--file", job)...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "qa", "--file", job)...); r.code != 0 || !strings.Contains(r.stdout, "duplicates 1") {
		t.Fatalf("resubmit: %d %q %q", r.code, r.stdout, r.stderr)
	}
	r := drover(t, append(etcdFlags(ns), "submit", "--queue", "qb", "--file", job)...)
	if r.code != 65 || !strings.Contains(r.stderr, "line 1: task_id job-1 already exists in queue qa") || !strings.Contains(r.stdout, "submitted 0, duplicates 0, rejected 1") {
		t.Fatalf("other queue: %d %q %q", r.code, r.stdout, r.stderr)
	}
	two := filepath.Join(dir, "two.jsonl")
	if err := os.WriteFile(two, []byte(`{"task_id":"k","task_type":"x"}`+"\n"+`{"task_id":"k","task_type":"y"}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = drover(t, append(etcdFlags(ns), "submit", "--queue", "qa", "--file", two)...)
	if r.code != 65 || !strings.Contains(r.stderr, "line 2: task_id k is also on line 1, with different content") {
		t.Fatalf("two lines, one id: %d %q %q", r.code, r.stdout, r.stderr)
	}
}

// TestQueueAdministration: queues list, a misspelt queue name, bulk cancel
// and purge, tasks wait, and queue delete.
func TestQueueAdministration(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "emails", "--file", writeTasks(t, "e", "ok", 50))...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	r := drover(t, append(etcdFlags(ns), "queues", "list", "--json")...)
	var qs []struct {
		Name  string
		Stats struct{ Pending int }
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &qs) != nil || len(qs) != 1 || qs[0].Name != "emails" || qs[0].Stats.Pending != 50 {
		t.Fatalf("queues list: %d %q %q", r.code, r.stdout, r.stderr)
	}
	for _, args := range [][]string{{"tasks", "stats", "--queue", "emial"}, {"tasks", "list", "--queue", "emial"}, {"dlq", "list", "--queue", "emial"}, {"dlq", "purge", "--queue", "emial", "--all"}, {"queues", "get", "emial"}} {
		if r := drover(t, append(etcdFlags(ns), args...)...); r.code != 1 || !strings.Contains(r.stderr, "queue emial does not exist") {
			t.Fatalf("%v: %d %q", args, r.code, r.stderr)
		}
	}
	// tasks wait: an unfinished task times out with 75, a cancelled one
	// exits 1, a succeeded one prints its result.
	if r := drover(t, append(etcdFlags(ns), "tasks", "wait", "e-00000", "--timeout", "300ms")...); r.code != 75 || !strings.Contains(r.stderr, "still PENDING") {
		t.Fatalf("wait with timeout: %d %q", r.code, r.stderr)
	}
	waiter := start(t, cleanEnv(), append(etcdFlags(ns), "tasks", "wait", "e-00001")...)
	if r := drover(t, append(etcdFlags(ns), "tasks", "cancel", "--queue", "emails", "e-00000", "e-00002", "--json")...); r.code != 0 || !strings.Contains(r.stdout, `"count":2`) {
		t.Fatalf("cancel two: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "wait", "e-00000")...); r.code != 1 || !strings.Contains(r.stderr, "CANCELLED") {
		t.Fatalf("wait on a cancelled task: %d %q", r.code, r.stderr)
	}
	script := filepath.Join(t.TempDir(), "h.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho '{\"id\":\"'$DROVER_TASK_ID'\"}'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, append(etcdFlags(ns), "worker", "--queue", "emails", "--handler", "exec:"+script, "--drain")...); r.code != 0 {
		t.Fatalf("worker: %d %q", r.code, r.stderr)
	}
	if code := waiter.wait(t, 10*time.Second); code != 0 || strings.TrimSpace(waiter.stdout.String()) != `{"id":"e-00001"}` {
		t.Fatalf("wait: %d %q %q", code, waiter.stdout.String(), waiter.stderr.String())
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "e-00001", "--json")...)
	if !strings.Contains(r.stdout, `"result":{"id":"e-00001"}`) {
		t.Fatalf("a JSON result stays JSON: %q", r.stdout)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "purge", "--queue", "emails", "--status", "SUCCEEDED", "--all")...); r.code != 0 || !strings.Contains(r.stdout, "purged 48 tasks") {
		t.Fatalf("purge: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "queues", "delete", "emails")...); r.code != 2 || !strings.Contains(r.stderr, "--yes") {
		t.Fatalf("delete without --yes: %d %q", r.code, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "queues", "delete", "emails", "--yes")...); r.code != 0 || !strings.Contains(r.stdout, "queue emails deleted with 2 tasks") {
		t.Fatalf("delete: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "stats", "--queue", "emails")...); r.code != 1 {
		t.Fatalf("stats of a deleted queue: %d %q", r.code, r.stdout)
	}
}
