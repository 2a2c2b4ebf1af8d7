package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
)

func TestDemo(t *testing.T) {
	tmp := t.TempDir()
	p := start(t, cleanEnv("TMPDIR="+tmp), "demo", "--json")
	code := p.wait(t, 60*time.Second)
	if code != 0 {
		t.Fatalf("drover demo --json: exit %d\nstdout:\n%s\nstderr:\n%s", code, p.stdout.String(), p.stderr.String())
	}
	var sum struct {
		TaskID                  string   `json:"task_id"`
		Workers                 []string `json:"workers"`
		CrashedWorker           string   `json:"crashed_worker"`
		CrashedDuringStep       int      `json:"crashed_during_step"`
		ResumedBy               string   `json:"resumed_by"`
		ResumedFromStep         int      `json:"resumed_from_step"`
		StepsCompleted          int      `json:"steps_completed"`
		CheckpointedStepsRedone *int     `json:"checkpointed_steps_redone"`
		TakeoverMillis          int64    `json:"takeover_ms"`
		FinalStatus             string   `json:"final_status"`
		DurationMillis          int64    `json:"duration_ms"`
		InvariantsMet           bool     `json:"invariants_met"`
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &sum); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, p.stdout.String())
	}
	if sum.TaskID == "" || len(sum.Workers) != 3 || sum.CrashedWorker == "" || sum.CrashedDuringStep != 3 ||
		sum.ResumedBy == "" || sum.ResumedBy == sum.CrashedWorker || sum.ResumedFromStep != 3 || sum.StepsCompleted != 4 ||
		sum.CheckpointedStepsRedone == nil || *sum.CheckpointedStepsRedone != 0 || sum.FinalStatus != "completed" ||
		!sum.InvariantsMet || sum.TakeoverMillis <= 0 {
		t.Fatalf("summary = %+v", sum)
	}
	if sum.DurationMillis > 30_000 {
		t.Fatalf("demo took %d ms, want under 30 s", sum.DurationMillis)
	}
	// The timeline went to stderr; every worker it started is gone, and so
	// is its temporary directory.
	pids := regexp.MustCompile(`started \(pid (\d+)\)`).FindAllStringSubmatch(p.stderr.String(), -1)
	if len(pids) != 3 {
		t.Fatalf("timeline names %d worker pids:\n%s", len(pids), p.stderr.String())
	}
	for _, m := range pids {
		pid, _ := strconv.Atoi(m[1])
		if proc.Alive(pid) {
			t.Fatalf("worker process %d outlived the demo", pid)
		}
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("demo left files behind in TMPDIR: %v", left)
	}
	if !strings.Contains(p.stderr.String(), "SIGKILL") || !strings.Contains(p.stderr.String(), "resumes at step 3") {
		t.Fatalf("timeline lacks the crash or the resume:\n%s", p.stderr.String())
	}
}

type historyOut struct {
	TaskID    string `json:"task_id"`
	Step      int    `json:"step"`
	Steps     int    `json:"steps"`
	Completed bool   `json:"completed"`
	History   []struct {
		Step   int    `json:"step"`
		Name   string `json:"name"`
		Worker string `json:"worker"`
		Token  int64  `json:"token"`
	} `json:"history"`
}

func taskHistory(t *testing.T, flags []string, id string) historyOut {
	t.Helper()
	r := drover(t, append(flags, "task", "history", id, "--json")...)
	var h historyOut
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &h) != nil {
		t.Fatalf("task history --json: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	return h
}

func TestTaskRunPassesStateAndResumesAfterFailure(t *testing.T) {
	ns := etcdtest.Namespace(t)
	flags := etcdFlags(ns)
	steps := []string{"--step", "ingest=printf A", "--step", `analyze=cat; printf "B$DROVER_STEP$DROVER_STEP_NAME$DROVER_TASK_ID"`, "--step", "report=cat; exit 3"}
	r := drover(t, append(flags, append([]string{"task", "run", "job"}, steps...)...)...)
	if r.code != 1 || !strings.Contains(r.stderr, "step 3 (report)") {
		t.Fatalf("failing step: exit %d, stderr %q", r.code, r.stderr)
	}
	h := taskHistory(t, flags, "job")
	if h.Step != 2 || h.Completed || len(h.History) != 2 {
		t.Fatalf("after a failed step 3: %+v", h)
	}
	steps[5] = "report=cat; printf C"
	r = drover(t, append(flags, append([]string{"task", "run", "job", "--json"}, steps...)...)...)
	var res struct {
		ResumedFrom int    `json:"resumed_from_step"`
		StepsRun    int    `json:"steps_run"`
		State       string `json:"state"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
		t.Fatalf("rerun: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if res.ResumedFrom != 3 || res.StepsRun != 1 || res.State != "AB2analyzejobC" {
		t.Fatalf("rerun result %+v", res)
	}
	r = drover(t, append(flags, append([]string{"task", "run", "job"}, steps...)...)...)
	if r.code != 0 || !strings.Contains(r.stderr, "already completed") || r.stdout != "AB2analyzejobC" {
		t.Fatalf("completed task rerun: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(flags, "task", "history", "job")...)
	if r.code != 0 || !strings.Contains(r.stdout, "completed, 3 of 3 steps") || !strings.Contains(r.stdout, "analyze") {
		t.Fatalf("task history: %q", r.stdout)
	}
}

func TestTaskRunBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"no steps", []string{"task", "run", "job"}, []string{"--step", "NAME=COMMAND"}},
		{"malformed step", []string{"task", "run", "job", "--step", "no-equals-sign"}, []string{"--step #1", "NAME=COMMAND"}},
		{"bad id", []string{"task", "run", "a/b", "--step", "a=true"}, []string{"task id", "letters, digits"}},
		{"bad ttl", []string{"task", "run", "job", "--ttl", "0s", "--step", "a=true"}, []string{"--ttl", "between 1s and 24h"}},
		{"bad history id", []string{"task", "history", ""}, []string{"task id"}},
		{"duplicate step name", []string{"task", "run", "job", "--step", "a=true", "--step", "a=false"}, []string{"--step #2 name", "unique"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			r := drover(t, append(etcdFlags(ns), tc.args...)...)
			if r.code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Fatalf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if h := taskHistory(t, etcdFlags(ns), "job"); h.Step != 0 {
				t.Fatalf("bad input wrote a checkpoint: %+v", h)
			}
		})
	}
}

// TestTaskSurvivesFullRestart stops every worker (SIGKILL) and the server
// itself mid-task, restarts the server on the same data, and runs the task
// again: it resumes after the last checkpoint.
func TestTaskSurvivesFullRestart(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	client := etcdtest.FreeAddr()
	serverArgs := []string{"server", "--data-dir", dataDir, "--etcd-listen", "http://" + client, "--etcd-peer-listen", "http://" + etcdtest.FreeAddr()}
	flags := []string{"--etcd-endpoints", client}
	marker := filepath.Join(t.TempDir(), "step2.pid")

	server := start(t, cleanEnv(), serverArgs...)
	waitFor(t, 30*time.Second, "the server", func() bool { return strings.Contains(server.stderr.String(), "ready") })
	slow := []string{"task", "run", "nightly", "--ttl", "2s", "--worker-id", "first",
		"--step", "fetch=printf fetched", "--step", "summarize=echo $$ > " + marker + "; exec sleep 60", "--step", "publish=cat; printf ' published'"}
	worker := start(t, cleanEnv(), append(flags, slow...)...)
	var stepPid int
	waitFor(t, 20*time.Second, "step 2 to start", func() bool {
		b, err := os.ReadFile(marker)
		stepPid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		return err == nil && stepPid > 0
	})
	if err := worker.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	worker.wait(t, 10*time.Second)
	// The step dies with its worker: it must not go on without the lock.
	waitFor(t, 5*time.Second, "the step process to die with its worker", func() bool { return !proc.Alive(stepPid) })
	if err := server.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := server.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("server exit %d", code)
	}

	server = start(t, cleanEnv(), serverArgs...)
	waitFor(t, 30*time.Second, "the restarted server", func() bool { return strings.Contains(server.stderr.String(), "ready") })
	h := taskHistory(t, flags, "nightly")
	if h.Step != 1 || len(h.History) != 1 || h.History[0].Worker != "first" {
		t.Fatalf("after the restart: %+v", h)
	}
	fast := []string{"task", "run", "nightly", "--ttl", "2s", "--worker-id", "second", "--json",
		"--step", "fetch=printf fetched", "--step", "summarize=cat; printf ' summarized'", "--step", "publish=cat; printf ' published'"}
	r := drover(t, append(flags, fast...)...)
	var res struct {
		ResumedFrom int    `json:"resumed_from_step"`
		State       string `json:"state"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil || res.ResumedFrom != 2 || res.State != "fetched summarized published" {
		t.Fatalf("after a full restart: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	h = taskHistory(t, flags, "nightly")
	if !h.Completed || len(h.History) != 3 || h.History[0].Worker != "first" || h.History[1].Worker != "second" || h.History[1].Token <= h.History[0].Token {
		t.Fatalf("history after the restart: %+v", h)
	}
	_ = server.cmd.Process.Signal(syscall.SIGTERM)
	server.wait(t, 20*time.Second)
}

func TestDemoLostUpdate(t *testing.T) {
	type result struct {
		Expected, Actual int
		Lost             int `json:"lost_updates"`
	}
	run := func(args ...string) result {
		t.Helper()
		r := drover(t, append([]string{"demo", "lost-update", "--json", "--workers", "5", "--invocations", "20", "--max-delay", "20ms"}, args...)...)
		var res result
		if r.code != 0 || json.Unmarshal([]byte(r.stdout), &res) != nil {
			t.Fatalf("demo lost-update %v: exit %d, %q, %q", args, r.code, r.stdout, r.stderr)
		}
		return res
	}
	redisAddr := servicetest.Redis(t)
	_ = servicetest.Postgres(t) // skips (or fails under DROVER_REQUIRE_SERVICES=1) when PostgreSQL is missing
	if res := run("--protect", "none"); res.Expected != 100 || res.Lost <= 0 || res.Actual+res.Lost != 100 {
		t.Fatalf("none: %+v, want lost updates", res)
	}
	a1, _ := servicetest.RedisServer(t)
	a2, _ := servicetest.RedisServer(t)
	a3, _ := servicetest.RedisServer(t)
	redlock := "redlock://" + a1 + "," + a2 + "," + a3
	paxosGroup := "paxos://" + startPaxosNodes(t, 3).endpoints()
	pg := servicetest.PostgresURL()
	var cases [][]string
	for _, store := range [][]string{{"--store", "etcd"}, {"--store", "postgres", "--database-url", pg}} {
		cases = append(cases, append([]string{"--protect", "cas"}, store...))
		for _, backend := range []string{"etcd", "redis://" + redisAddr + "/0", redlock, paxosGroup} {
			cases = append(cases, append([]string{"--protect", "lock", "--lock-backend", backend}, store...))
		}
	}
	if res := run("--protect", "none", "--store", "postgres", "--database-url", pg); res.Lost <= 0 {
		t.Fatalf("none on postgres: %+v, want lost updates", res)
	}
	for _, args := range cases {
		if res := run(args...); res.Expected != 100 || res.Actual != 100 || res.Lost != 0 {
			t.Fatalf("%v: %+v, want every update kept", args, res)
		}
	}
	if r := drover(t, "demo", "lost-update", "--protect", "maybe"); r.code != 2 || !strings.Contains(r.stderr, "--protect") {
		t.Fatalf("bad --protect: exit %d, %q", r.code, r.stderr)
	}
}
