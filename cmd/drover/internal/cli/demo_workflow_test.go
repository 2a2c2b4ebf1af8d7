package cli_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/proc"
)

// TestDemoWorkflow runs drover demo workflow --json as a real process and
// checks that it exits 0 and that its summary shows every invariant: each
// of the 50 searches ran once, the worker that parked the agent was killed
// while it waited, the approval woke it and was consumed once, the other
// worker resumed it once, and the report holds the 50 findings and the
// approval; that after the kill the task held no claim and no leased key
// and nothing ran in its queue; that no process or file is left behind.
func TestDemoWorkflow(t *testing.T) {
	tmp := t.TempDir()
	p := start(t, cleanEnv("TMPDIR="+tmp), "demo", "workflow", "--json")
	code := p.wait(t, 90*time.Second)
	if code != 0 {
		t.Fatalf("drover demo workflow --json: exit %d\nstdout:\n%s\nstderr:\n%s", code, p.stdout.String(), p.stderr.String())
	}
	var sum struct {
		Workers          []string       `json:"workers"`
		Children         int            `json:"children"`
		ChildRuns        int            `json:"child_runs"`
		ChildrenRunOnce  int            `json:"children_run_once"`
		ChildrenRunMore  []string       `json:"children_run_more_than_once"`
		ChildrenStored   int64          `json:"children_succeeded_in_etcd"`
		StepRuns         map[string]int `json:"step_runs"`
		StepRecords      int            `json:"step_records"`
		KilledWorker     string         `json:"killed_worker"`
		StatusAfterKill  string         `json:"status_after_kill"`
		KillConfirmed    bool           `json:"kill_confirmed"`
		RunningAfterKill *int64         `json:"running_after_kill"`
		HeldAfterKill    []string       `json:"held_after_kill"`
		SeenVersion      int64          `json:"signal_seen_version"`
		SignalWoke       bool           `json:"signal_woke"`
		SignalRetryStore bool           `json:"signal_retry_stored"`
		SignalsConsumed  *int64         `json:"signals_consumed"`
		SignalsLeft      *int64         `json:"signals_left"`
		ResumedBy        string         `json:"resumed_by"`
		ParentResumes    int            `json:"parent_resumes"`
		FinalStatus      string         `json:"final_status"`
		Findings         int            `json:"findings"`
		ApprovedBy       string         `json:"approved_by"`
		InvariantsMet    bool           `json:"invariants_met"`
		Violations       []string       `json:"violations"`
	}
	if err := json.Unmarshal([]byte(p.stdout.String()), &sum); err != nil {
		t.Fatalf("stdout is not one JSON object: %v\n%s", err, p.stdout.String())
	}
	switch {
	case len(sum.Workers) != 2 || sum.Children != 50:
		t.Fatalf("workers %v, children %d: want 2 and 50", sum.Workers, sum.Children)
	case sum.ChildRuns != 50 || sum.ChildrenRunOnce != 50 || len(sum.ChildrenRunMore) != 0 || sum.ChildrenStored != 50:
		t.Fatalf("searches: %d runs, %d once, %v more often, %d stored SUCCEEDED; want each of 50 once",
			sum.ChildRuns, sum.ChildrenRunOnce, sum.ChildrenRunMore, sum.ChildrenStored)
	case sum.StepRuns["plan"] != 1 || sum.StepRuns["merge"] != 1 || sum.StepRuns["act"] != 1 || sum.StepRecords != 3:
		t.Fatalf("step runs %v, %d records: want each once, 3", sum.StepRuns, sum.StepRecords)
	case sum.KilledWorker == "" || !sum.KillConfirmed || sum.StatusAfterKill != "WAITING":
		t.Fatalf("killed %q (confirmed %t), then the task was %q: want a worker killed while it waited", sum.KilledWorker, sum.KillConfirmed, sum.StatusAfterKill)
	case sum.RunningAfterKill == nil || *sum.RunningAfterKill != 0 || sum.HeldAfterKill == nil || len(sum.HeldAfterKill) != 0:
		t.Fatalf("after the kill: running %v, held %v: want 0 and [] (no claim, no leased key)", sum.RunningAfterKill, sum.HeldAfterKill)
	case !sum.SignalWoke || sum.SignalRetryStore || sum.SignalsConsumed == nil || *sum.SignalsConsumed != 1 || sum.SignalsLeft == nil || *sum.SignalsLeft != 0 || sum.SeenVersion != 1:
		t.Fatalf("signal: woke %t, retry stored %t, consumed %v (tombstone version %d), left %v: want true, false, 1 (1), 0",
			sum.SignalWoke, sum.SignalRetryStore, sum.SignalsConsumed, sum.SeenVersion, sum.SignalsLeft)
	case sum.ParentResumes != 1 || sum.ResumedBy == "" || sum.ResumedBy == sum.KilledWorker:
		t.Fatalf("resumed %d times by %q (killed %q): want once by the other worker", sum.ParentResumes, sum.ResumedBy, sum.KilledWorker)
	case sum.FinalStatus != "SUCCEEDED" || sum.Findings != 50 || sum.ApprovedBy != "ana":
		t.Fatalf("final %s, %d findings, approved by %q", sum.FinalStatus, sum.Findings, sum.ApprovedBy)
	case !sum.InvariantsMet || len(sum.Violations) != 0:
		t.Fatalf("invariants met %t: %v", sum.InvariantsMet, sum.Violations)
	}
	tl := p.stderr.String()
	pids := regexp.MustCompile(`started \(pid (\d+)\)`).FindAllStringSubmatch(tl, -1)
	if len(pids) != 2 {
		t.Fatalf("timeline names %d worker pids:\n%s", len(pids), tl)
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
	for _, want := range []string{"SIGKILL " + sum.KilledWorker, "approver  pid", "step 3 act: resumes with the approval"} {
		if !strings.Contains(tl, want) {
			t.Fatalf("timeline lacks %q:\n%s", want, tl)
		}
	}
}

// TestDemoWorkflowHelp: the command's help names what it does and gives an
// example.
func TestDemoWorkflowHelp(t *testing.T) {
	r := drover(t, "demo", "workflow", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "drover demo workflow --json") || !strings.Contains(r.stdout, "SIGKILL") {
		t.Fatalf("exit %d, stdout %q", r.code, r.stdout)
	}
}
