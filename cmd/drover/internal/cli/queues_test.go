package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

func TestQueueMaxDepth(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "queues", "set", "q", "--max-depth", "40")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	var b strings.Builder
	for i := range 50 {
		fmt.Fprintf(&b, `{"task_id":"t%02d","task_type":"x"}`+"\n", i)
	}
	f := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	r := drover(t, append(etcdFlags(ns), "submit", "--queue", "q", "--file", f, "--json")...)
	var res struct {
		Submitted int `json:"submitted"`
	}
	if r.code != 75 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.Submitted != 40 || !strings.Contains(r.stderr, "queue q is full") || !strings.Contains(r.stderr, "--max-depth") {
		t.Fatalf("submit over the bound: exit %d, stdout %q, stderr %q; want exit 75 after 40", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "queues", "get", "q", "--json")...)
	var got struct {
		MaxDepth int64 `json:"max_depth"`
		Depth    int64 `json:"depth"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || got.MaxDepth != 40 || got.Depth != 40 {
		t.Fatalf("queues get: %q %v", r.stdout, err)
	}
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"queues", "set", "q", "--max-depth", "-5"}, "--max-depth"},
		{[]string{"queues", "set", "bad/q", "--max-depth", "5"}, "Q"},
		{[]string{"queues", "set", "q"}, "--max-depth"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.flag) {
			t.Errorf("%v: exit %d %q", tc.args, r.code, r.stderr)
		}
	}
}
