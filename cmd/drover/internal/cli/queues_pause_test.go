package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
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
	met := "127.0.0.1:" + port(t)
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "pq", "--concurrency", "2", "--metrics-listen", met,
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
	pausedGauge := func() float64 { return sum(scrape(t, met)["drover_queue_paused"], map[string]string{"queue": "pq"}) }
	if g := pausedGauge(); g != 1 {
		t.Fatalf("the worker's drover_queue_paused is %v while paused", g)
	}
	for i, want := range []bool{true, false} {
		r := drover(t, append(etcdFlags(ns), "queues", "resume", "pq", "--json")...)
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Paused || st.Changed != want {
			t.Fatalf("resume %d: exit %d %q %q", i, r.code, r.stdout, r.stderr)
		}
	}
	waitFor(t, 30*time.Second, "every task run after the resume", func() bool { return lines(started) == 12 })
	if g := pausedGauge(); g != 0 {
		t.Fatalf("the worker's drover_queue_paused is %v after the resume", g)
	}
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
	for _, verb := range []string{"pause", "resume"} {
		if r := drover(t, "queues", verb, "--help"); r.code != 0 || !strings.Contains(r.stdout, "Examples:") || !strings.Contains(r.stdout, "drover queues "+verb+" emails") {
			t.Errorf("%s --help: %q", verb, r.stdout)
		}
	}
}

// TestPauseSurvivesServerRestart: over HTTP, a long-poll claim waiting on
// an empty queue gets nothing when a task is submitted after a pause; the
// pause is in etcd, so a restarted server still answers paused and claims
// nothing; the resume lets a claim take the task. Unknown queues are 404.
func TestPauseSurvivesServerRestart(t *testing.T) {
	data := filepath.Join(t.TempDir(), "data")
	api := "127.0.0.1:" + port(t)
	args := []string{"server", "--data-dir", data, "--etcd-listen", "http://" + etcdtest.FreeAddr(),
		"--etcd-peer-listen", "http://" + etcdtest.FreeAddr(), "--http-listen", api}
	serve := func() *process {
		p := start(t, cleanEnv(), args...)
		waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "HTTP API ready") })
		return p
	}
	call := func(method, path string, body any) (int, map[string]any) {
		var rd io.Reader
		if body != nil {
			raw, _ := json.Marshal(body)
			rd = bytes.NewReader(raw)
		}
		req, _ := http.NewRequest(method, "http://"+api+path, rd)
		req.Header.Set("Content-Type", "application/json")
		r, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer r.Body.Close()
		var out map[string]any
		_ = json.NewDecoder(r.Body).Decode(&out)
		return r.StatusCode, out
	}
	claim := func(wait string) []any {
		code, sess := call("POST", "/v1/sessions", map[string]any{"ttl": 30})
		if code != 201 {
			t.Fatalf("session: %d %v", code, sess)
		}
		code, out := call("POST", "/v1/queues/hq/claim", map[string]any{"session": sess["id"], "wait": wait})
		if code != 200 {
			t.Fatalf("claim: %d %v", code, out)
		}
		return out["tasks"].([]any)
	}
	srv := serve()
	submit := func(id string) {
		if code, out := call("POST", "/v1/queues/hq/tasks", []map[string]any{{"task_id": id, "task_type": "x"}}); code != 200 {
			t.Fatalf("submit: %d %v", code, out)
		}
	}
	submit("first")
	if got := claim("0s"); len(got) != 1 {
		t.Fatalf("claim of a running queue: %v", got)
	}
	// A long poll waiting on the empty queue, then the pause, then a task.
	polled := make(chan []any, 1)
	go func() { polled <- claim("3s") }()
	time.Sleep(300 * time.Millisecond) // the poll is (most likely) waiting; either way it must get nothing
	if code, out := call("POST", "/v1/queues/hq/pause", nil); code != 200 || out["paused"] != true || out["changed"] != true {
		t.Fatalf("pause: %d %v", code, out)
	}
	submit("second")
	if got := <-polled; len(got) != 0 {
		t.Fatalf("a long poll claimed %v from a paused queue", got)
	}
	if code, out := call("POST", "/v1/queues/bad*q/pause", nil); code/100 != 4 || code == 404 || !strings.Contains(fmt.Sprint(out), "queue") {
		t.Fatalf("pause of a bad name: %d %v", code, out)
	}
	for _, path := range []string{"/v1/queues/nope/pause", "/v1/queues/nope/resume"} {
		if code, out := call("POST", path, nil); code != 404 || !strings.Contains(out["detail"].(string), "no such queue") {
			t.Fatalf("%s: %d %v", path, code, out)
		}
	}

	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	if code := srv.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("server exit %d:\n%s", code, srv.stderr.String())
	}
	srv = serve()
	if code, st := call("GET", "/v1/queues/hq/stats", nil); code != 200 || st["paused"] != true || st["pending"] != 1.0 {
		t.Fatalf("stats after a restart: %d %v", code, st)
	}
	if got := claim("500ms"); len(got) != 0 {
		t.Fatalf("claimed %v from a paused queue after a restart", got)
	}
	if code, out := call("POST", "/v1/queues/hq/resume", nil); code != 200 || out["paused"] != false || out["changed"] != true {
		t.Fatalf("resume: %d %v", code, out)
	}
	if got := claim("5s"); len(got) != 1 {
		t.Fatalf("claim after the resume: %v", got)
	}
	_ = srv.cmd.Process.Signal(syscall.SIGTERM)
	srv.wait(t, 20*time.Second)
}

// TestServerMetricsQueuePaused: the server's /metrics has
// drover_queue_paused for the queues of its namespace: 1 while paused, 0
// once resumed.
func TestServerMetricsQueuePaused(t *testing.T) {
	s := startAPIServer(t)
	s.call("POST", "/v1/queues/pm/tasks", []map[string]any{{"task_id": "x", "task_type": "x"}}, 200)
	gauge := func() float64 { return sum(scrape(t, s.met)["drover_queue_paused"], map[string]string{"queue": "pm"}) }
	s.call("POST", "/v1/queues/pm/pause", nil, 200)
	// The server reads the queues every 5 s: the bound only guards against a hang.
	waitFor(t, 60*time.Second, "drover_queue_paused 1", func() bool { time.Sleep(100 * time.Millisecond); return gauge() == 1 })
	s.call("POST", "/v1/queues/pm/resume", nil, 200)
	waitFor(t, 60*time.Second, "drover_queue_paused 0", func() bool { time.Sleep(100 * time.Millisecond); return gauge() == 0 })
}
