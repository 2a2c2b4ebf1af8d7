package cli_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

type submitOut struct {
	Submitted  int `json:"submitted"`
	Duplicates int `json:"duplicates"`
	Rejected   []struct {
		Line  int    `json:"line"`
		Error string `json:"error"`
	} `json:"rejected"`
}

func TestSubmitJSONLWithBadLines(t *testing.T) {
	ns := etcdtest.Namespace(t)
	file := filepath.Join(t.TempDir(), "tasks.jsonl")
	lines := []string{
		`{"task_id":"a1","task_type":"sum","parameters":{"x":1}}`,
		`not json at all`,
		`{"task_id":"a2","task_type":"sum","max_retries":"three"}`,
		`{"task_type":"sum"}`,
		`{"task_id":"a3","task_type":"sum","parameters":{"blob":"` + strings.Repeat("x", 70000) + `"}}`,
		``,
		`{"task_id":"a4","task_type":"sum","metadata":{"priority":7,"tenant":"acme"}}`,
		`{"task_id":"a5","task_type":"sum","unknown_field":1}`,
		`{"task_id":"a/6","task_type":"sum"}`,
		`{"task_id":"a7","task_type":"sum"}`,
	}
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--file", file, "--json")...)
	var out submitOut
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatalf("stdout %q: %v", r.stdout, err)
	}
	if r.code != 65 || out.Submitted != 3 || out.Duplicates != 0 || len(out.Rejected) != 6 {
		t.Fatalf("exit %d, %+v", r.code, out)
	}
	for i, want := range []struct {
		line int
		text string
	}{{2, "malformed JSON"}, {3, "max_retries"}, {4, "task_id is required"}, {5, "payload"}, {8, "unknown_field"}, {9, "task_id"}} {
		if got := out.Rejected[i]; got.Line != want.line || !strings.Contains(got.Error, want.text) {
			t.Fatalf("rejection %d = %+v, want line %d mentioning %q", i, got, want.line, want.text)
		}
	}
	// Submitting the same file again creates nothing new.
	r = drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--file", file, "--json")...)
	out = submitOut{}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil || out.Submitted != 0 || out.Duplicates != 3 || len(out.Rejected) != 6 {
		t.Fatalf("resubmit: %q (%v)", r.stdout, err)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "stats", "--queue", "jobs", "--json")...)
	if strings.TrimSpace(r.stdout) != `{"pending":3,"running":0,"retrying":0,"succeeded":0,"dead":0,"cancelled":0,"scheduled":0,"paused":false,"sleeping":0,"waiting":0}` {
		t.Fatalf("stats %q", r.stdout)
	}
	r = drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--type", "sum", "--id", "one", "--param", "x=5", "--param", "name=ada")...)
	if r.code != 0 || !strings.Contains(r.stdout, "submitted 1") {
		t.Fatalf("single submit: exit %d %q %q", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "one", "--json")...)
	var task struct {
		Parameters map[string]any `json:"parameters"`
		Status     string         `json:"current_status"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &task); err != nil || task.Parameters["x"] != 5.0 || task.Parameters["name"] != "ada" || task.Status != "PENDING" {
		t.Fatalf("tasks get: %q (%v)", r.stdout, err)
	}
}

func TestWorkerExecAndDLQ(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	var lines []string
	for i := 0; i < 20; i++ {
		lines = append(lines, fmt.Sprintf(`{"task_id":"ok-%d","task_type":"ok"}`, i))
	}
	lines = append(lines, `{"task_id":"bad","task_type":"bad"}`, `{"task_id":"flaky","task_type":"flaky","max_retries":1}`)
	file := filepath.Join(dir, "tasks.jsonl")
	if err := os.WriteFile(file, []byte(strings.Join(lines, "\n")), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--file", file)...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	script := filepath.Join(dir, "handler.sh")
	if err := os.WriteFile(script, []byte(`#!/bin/sh
case "$DROVER_TASK_TYPE" in
ok) echo "done $DROVER_TASK_ID" ;;
bad) echo "cannot parse" >&2; exit 65 ;;
flaky) echo "try again" >&2; exit 1 ;;
esac
`), 0o755); err != nil {
		t.Fatal(err)
	}
	r := drover(t, append(etcdFlags(ns), "worker", "--queue", "jobs", "--concurrency", "4", "--handler", "exec:"+script,
		"--drain", "--backoff-base", "50ms", "--backoff-max", "100ms", "--json")...)
	var st struct{ Succeeded, Dead int }
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil || st.Succeeded != 20 || st.Dead != 2 || !strings.Contains(r.stdout, `"succeeded":20,`) {
		t.Fatalf("worker: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "dlq", "list", "--queue", "jobs", "--json")...)
	var dead []struct {
		ID        string `json:"task_id"`
		LastError string `json:"last_error"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &struct{ Tasks any }{&dead}); err != nil || len(dead) != 2 {
		t.Fatalf("dlq list: %q (%v)", r.stdout, err)
	}
	r = drover(t, append(etcdFlags(ns), "dlq", "show", "bad")...)
	if r.code != 0 || !strings.Contains(r.stdout, "cannot parse") || !strings.Contains(r.stdout, "DEAD") {
		t.Fatalf("dlq show: %q", r.stdout)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "ok-3")...)
	if !strings.Contains(r.stdout, "SUCCEEDED") || !strings.Contains(r.stdout, "done ok-3") {
		t.Fatalf("tasks get: %q", r.stdout)
	}
	if r := drover(t, append(etcdFlags(ns), "dlq", "requeue", "--queue", "jobs", "flaky")...); r.code != 0 || !strings.Contains(r.stdout, "requeued 1") {
		t.Fatalf("requeue: %q %q", r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "list", "--queue", "jobs", "--status", "pending", "--json")...)
	if !strings.Contains(r.stdout, `"task_id":"flaky"`) {
		t.Fatalf("requeued task not pending: %q", r.stdout)
	}
	if r := drover(t, append(etcdFlags(ns), "dlq", "purge", "--queue", "jobs", "--all")...); r.code != 0 || !strings.Contains(r.stdout, "purged 1") {
		t.Fatalf("purge: %q %q", r.stdout, r.stderr)
	}
}

func TestWorkerGracefulShutdownHandsTasksBack(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--type", "slow", "--id", "long")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	marker := filepath.Join(t.TempDir(), "started")
	p := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "jobs", "--handler", "exec:touch "+marker+"; exec sleep 30",
		"--shutdown-timeout", "500ms", "--grace", "200ms")...)
	waitFor(t, 20*time.Second, "the task to start", func() bool { _, err := os.Stat(marker); return err == nil })
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("worker exit %d after SIGTERM; stderr:\n%s", code, p.stderr.String())
	}
	r := drover(t, append(etcdFlags(ns), "tasks", "get", "long", "--json")...)
	var task struct {
		Status  string `json:"current_status"`
		Retries int    `json:"retries_attempted"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &task); err != nil || task.Status != "PENDING" || task.Retries != 0 {
		t.Fatalf("after a graceful stop the task is %q (%v), want PENDING with its budget intact", r.stdout, err)
	}
}

func TestTasksCancelKillsProcess(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "jobs", "--type", "slow", "--id", "victim")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	pidFile := filepath.Join(t.TempDir(), "pid")
	p := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "jobs", "--handler", "exec:echo $$ > "+pidFile+"; exec sleep 30", "--drain", "--grace", "200ms")...)
	var pid int
	waitFor(t, 20*time.Second, "the task to start", func() bool {
		b, err := os.ReadFile(pidFile)
		if err != nil {
			return false
		}
		_, err = fmt.Sscanf(string(b), "%d", &pid)
		return err == nil
	})
	if r := drover(t, append(etcdFlags(ns), "tasks", "cancel", "victim")...); r.code != 0 {
		t.Fatalf("cancel: %q", r.stderr)
	}
	waitFor(t, 10*time.Second, "the task's process to die", func() bool { return !proc.Alive(pid) })
	if code := p.wait(t, 15*time.Second); code != 0 {
		t.Fatalf("worker exit %d", code)
	}
	r := drover(t, append(etcdFlags(ns), "tasks", "get", "victim", "--json")...)
	if !strings.Contains(r.stdout, `"current_status":"CANCELLED"`) {
		t.Fatalf("after cancel: %q", r.stdout)
	}
}
