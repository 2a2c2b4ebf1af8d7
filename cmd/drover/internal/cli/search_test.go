package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

type searchOut struct {
	Data []struct {
		ID     string `json:"task_id"`
		Status string `json:"current_status"`
	} `json:"data"`
	Next    string `json:"next_cursor"`
	Scanned int    `json:"scanned"`
}

// TestTasksSearch: tasks search finds by id prefix, type and parameter,
// pages with --cursor, and answers bad input with exit 2 naming the flag,
// an unknown queue with exit 1.
func TestTasksSearch(t *testing.T) {
	ns := etcdtest.Namespace(t)
	flags := etcdFlags(ns)
	if r := drover(t, append(flags, "submit", "--queue", "look", "--file", writeTasks(t, "r", "x", 30))...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	if r := drover(t, append(flags, "submit", "--queue", "look", "--type", "summarize", "--id", "mail-1", "--param", "thread=4411")...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	search := func(args ...string) searchOut {
		t.Helper()
		r := drover(t, append(append(flags, "tasks", "search", "--queue", "look", "--json"), args...)...)
		var out searchOut
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &out) != nil {
			t.Fatalf("%v: exit %d, %q %q", args, r.code, r.stdout, r.stderr)
		}
		return out
	}
	if got := search("--id-prefix", "r-0001"); len(got.Data) != 10 || got.Data[0].ID != "r-00010" || got.Next != "" {
		t.Fatalf("id prefix: %+v", got)
	}
	if got := search("--param", "thread=4411", "--since", "1h", "--status", "pending"); len(got.Data) != 1 || got.Data[0].ID != "mail-1" {
		t.Fatalf("param: %+v", got)
	}
	seen := map[string]bool{}
	for cursor := ""; ; {
		args := []string{"--type", "x", "--limit", "7"}
		if cursor != "" {
			args = append(args, "--cursor", cursor)
		}
		p := search(args...)
		for _, d := range p.Data {
			if seen[d.ID] {
				t.Fatalf("%s twice", d.ID)
			}
			seen[d.ID] = true
		}
		if cursor = p.Next; cursor == "" {
			break
		}
	}
	if len(seen) != 30 {
		t.Fatalf("pages found %d, want 30", len(seen))
	}
	r := drover(t, append(flags, "tasks", "search", "--queue", "look", "--type", "x", "--limit", "5")...)
	if r.code != 0 || strings.Count(r.stdout, "PENDING") != 5 || !strings.Contains(r.stderr, "drover tasks search --queue look --type x --limit 5 --cursor ") {
		t.Fatalf("text: exit %d, %q %q", r.code, r.stdout, r.stderr)
	}
	other := search("--type", "x", "--limit", "2").Next
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--param", "a b=1"}, "--param"},
		{[]string{"--param", "thread"}, "must be k=v"},
		{[]string{"--since", "2026-11-28T10:00:00Z", "--until", "2026-11-28T09:00:00Z"}, "--until"},
		{[]string{"--since", "yesterday"}, "--since"},
		{[]string{"--status", "DONE"}, "--status"},
		{[]string{"--type", "summarize", "--cursor", other}, "another query"},
		{[]string{"--limit", "0"}, "--limit"},
	} {
		r := drover(t, append(append(flags, "tasks", "search", "--queue", "look"), tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 naming %s", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if r := drover(t, append(flags, "tasks", "search", "--queue", "nosuch")...); r.code != 1 || !strings.Contains(r.stderr, "nosuch") {
		t.Fatalf("unknown queue: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "tasks", "search", "--help"); r.code != 0 || !strings.Contains(r.stdout, "drover tasks search --queue emails --param thread=4411") {
		t.Fatalf("help: %d %q", r.code, r.stdout)
	}
}
