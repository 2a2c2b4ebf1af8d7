package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// lines counts the lines of file path (0 when it does not exist).
func lines(path string) int {
	b, _ := os.ReadFile(path)
	return strings.Count(string(b), "\n")
}

// TestQueuesPauseResume: with a `drover worker` process running, `queues
// pause` lets the running tasks finish and be acknowledged and no task
// start after them; the pause shows in `queues list` and `tasks stats`;
// pausing twice and resuming twice are not errors; `queues resume` lets
// the rest run. A bad name exits 2 and an unknown queue 1.
func TestQueuesPauseResume(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "pq", "call", 12, "")
	dir := t.TempDir()
	started, gate := filepath.Join(dir, "started"), filepath.Join(dir, "gate")
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "pq", "--concurrency", "2",
		"--handler", "exec:echo x >> "+started+"; while [ ! -f "+gate+" ]; do sleep 0.02; done")...)
	waitFor(t, 30*time.Second, "two tasks running", func() bool { return lines(started) >= 2 })

	var st struct {
		Queue   string `json:"queue"`
		Paused  bool   `json:"paused"`
		Changed bool   `json:"changed"`
		Since   string `json:"since"`
	}
	for i, want := range []bool{true, false} {
		r := drover(t, append(etcdFlags(ns), "queues", "pause", "pq", "--json")...)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || !st.Paused || st.Changed != want || st.Since == "" {
			t.Fatalf("pause %d: exit %d %q %q", i, r.code, r.stdout, r.stderr)
		}
	}
	atPause := lines(started)
	if err := os.WriteFile(gate, nil, 0o644); err != nil { // the running tasks finish
		t.Fatal(err)
	}
	var stats struct {
		Pending, Running, Succeeded int64
		Paused                      bool
	}
	waitFor(t, 30*time.Second, "the running tasks acknowledged", func() bool {
		r := drover(t, append(etcdFlags(ns), "tasks", "stats", "--queue", "pq", "--json")...)
		return json.Unmarshal([]byte(r.stdout), &stats) == nil && stats.Running == 0 && stats.Succeeded == int64(atPause)
	})
	if !stats.Paused || stats.Pending != int64(12-atPause) {
		t.Fatalf("stats while paused: %+v", stats)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "stats", "--queue", "pq")...); !strings.Contains(r.stdout, "paused") {
		t.Fatalf("tasks stats: %q", r.stdout)
	}
	r := drover(t, append(etcdFlags(ns), "queues", "list")...)
	if !strings.Contains(r.stdout, "PAUSED") || !strings.Contains(r.stdout, "true") {
		t.Fatalf("queues list: %q", r.stdout)
	}
	// A window in which the worker would have started more: none starts.
	time.Sleep(time.Second)
	if n := lines(started); n != atPause {
		t.Fatalf("%d tasks started while paused (had %d)", n-atPause, atPause)
	}
	for i, want := range []bool{true, false} {
		r := drover(t, append(etcdFlags(ns), "queues", "resume", "pq", "--json")...)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Paused || st.Changed != want {
			t.Fatalf("resume %d: exit %d %q %q", i, r.code, r.stdout, r.stderr)
		}
	}
	waitFor(t, 30*time.Second, "every task run after the resume", func() bool { return lines(started) == 12 })
	_ = w.cmd.Process.Kill()

	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"queues", "pause", "bad/q"}, 2, "Q"},
		{[]string{"queues", "resume", "bad/q"}, 2, "Q"},
		{[]string{"queues", "pause", "nope"}, 1, "no such queue"},
		{[]string{"queues", "resume", "nope"}, 1, "no such queue"},
		{[]string{"queues", "pause"}, 2, "arg"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		if r.code != tc.code || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%v: exit %d %q; want %d and %q", tc.args, r.code, r.stderr, tc.code, tc.want)
		}
	}
	if r := drover(t, "queues", "pause", "--help"); r.code != 0 || !strings.Contains(r.stdout, "drover queues pause emails") {
		t.Errorf("pause --help: %q", r.stdout)
	}
}
