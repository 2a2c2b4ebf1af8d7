package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// workflowScript is an exec handler whose task is three steps: step 1
// spawns three children into queue kids (DROVER_SPAWN_FILE); step 2 keeps
// their outcomes (DROVER_CHILDREN_FILE) and waits for the signal approval
// (DROVER_WAIT_FILE); step 3 prints the signal (DROVER_SIGNAL_FILE). A
// task of queue kids logs its id. Each run logs "step N".
const workflowScript = `if [ "$DROVER_QUEUE" = kids ]; then echo "$DROVER_TASK_ID" >> "$KIDS"; printf '{"kid":"%s"}' "$DROVER_TASK_ID"; exit 0; fi
echo "step $DROVER_STEP" >> "$LOG"
case "$DROVER_STEP" in
1) printf plan; echo '{"children":[{"queue":"kids","task_type":"k"},{"queue":"kids","task_type":"k"},{"queue":"kids","task_type":"k","key":"x"}]}' > "$DROVER_SPAWN_FILE" ;;
2) cp "$DROVER_CHILDREN_FILE" "$OUTS"; printf merged; echo "approval 1h" > "$DROVER_WAIT_FILE" ;;
3) printf '%s|%s|' "$(cat "$DROVER_STATE_FILE")" "$DROVER_SIGNAL_NAME"; cat "$DROVER_SIGNAL_FILE" ;;
esac`

// Exec steps of drover worker spawn children and wait for a signal: the
// parent parks WAITING for its children, resumes with their outcomes once
// they ran (each once), parks WAITING for the signal; its worker is
// SIGKILLed during the wait, and another resumes it once drover signal
// sent it. Each step runs once.
func TestWorkerExecStepsSpawnAndWait(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	script, log, kids, outs := filepath.Join(dir, "wf.sh"), filepath.Join(dir, "steps.log"), filepath.Join(dir, "kids.log"), filepath.Join(dir, "outs.json")
	if err := os.WriteFile(script, []byte(workflowScript), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, append(etcdFlags(ns), "queues", "set", "kids", "--max-depth", "100")...); r.code != 0 {
		t.Fatalf("queues set: %d %s", r.code, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "wf", "--type", "agent", "--id", "lead-1", "--param", "id=1")...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	env := cleanEnv("LOG="+log, "KIDS="+kids, "OUTS="+outs)
	worker := func(q string) *process {
		return start(t, env, append(etcdFlags(ns), "worker", "--queue", q, "--ttl", "2s", "--handler", "exec:sh "+script)...)
	}
	kidsWorker := worker("kids")
	victim := worker("wf")
	var view struct {
		Status     string `json:"current_status"`
		WaitingFor *struct {
			Signals []string `json:"signals"`
		} `json:"waiting_for"`
		Result json.RawMessage `json:"result"`
	}
	get := func() {
		r := drover(t, append(etcdFlags(ns), "tasks", "get", "lead-1", "--json")...)
		view.WaitingFor = nil
		_ = json.Unmarshal([]byte(r.stdout), &view)
	}
	waitFor(t, 60*time.Second, "the parent to wait for the signal", func() bool {
		get()
		return view.Status == "WAITING" && view.WaitingFor != nil && len(view.WaitingFor.Signals) == 1
	})
	_ = victim.cmd.Process.Signal(syscall.SIGKILL)
	victim.wait(t, 30*time.Second)
	rescuer := worker("wf")
	if r := drover(t, append(etcdFlags(ns), "signal", "lead-1", "approval", "--data", `{"ok":true}`)...); r.code != 0 {
		t.Fatalf("signal: %d %s %s", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "wait", "lead-1", "--timeout", "90s")...); r.code != 0 {
		t.Fatalf("tasks wait: %d %s %s; rescuer: %s", r.code, r.stdout, r.stderr, rescuer.stderr.String())
	}
	get()
	var res string
	_ = json.Unmarshal(view.Result, &res)
	if view.Status != "SUCCEEDED" || !strings.HasPrefix(res, "merged|approval|") || !strings.Contains(res, `"data":{"ok":true}`) {
		t.Fatalf("parent: %s %s", view.Status, view.Result)
	}
	for _, p := range []*process{rescuer, kidsWorker} {
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		p.wait(t, 30*time.Second)
	}
	b, _ := os.ReadFile(log)
	if got := strings.Join(strings.Split(strings.TrimSpace(string(b)), "\n"), ","); got != "step 1,step 2,step 3" {
		t.Fatalf("steps ran %q; want each once", got)
	}
	b, _ = os.ReadFile(kids)
	ran := strings.Fields(string(b))
	sort.Strings(ran)
	if strings.Join(ran, " ") != "lead-1.1.0 lead-1.1.1 lead-1.1.x" {
		t.Fatalf("children ran %v; want each once", ran)
	}
	var got []struct {
		ID     string          `json:"id"`
		Status string          `json:"status"`
		Result json.RawMessage `json:"result"`
	}
	b, _ = os.ReadFile(outs)
	if err := json.Unmarshal(b, &got); err != nil || len(got) != 3 {
		t.Fatalf("children's outcomes: %v %s", err, b)
	}
	for _, o := range got {
		if o.Status != "SUCCEEDED" || !strings.Contains(string(o.Result), o.ID) {
			t.Fatalf("outcome %+v", o)
		}
	}
}

// Bad exec step ends: a spawn into a queue that does not exist, and a
// wait for a signal name that is not valid, each end the task DEAD (not
// retried) with an error naming the file and the field; neither
// checkpoints the step (task history shows none).
func TestWorkerExecStepBadEnds(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "bad.sh")
	body := `case "$DROVER_TASK_ID" in
spawn-1) echo '{"children":[{"queue":"nowhere","task_type":"k"}]}' > "$DROVER_SPAWN_FILE" ;;
wait-1) echo "not-a-name! 1h" > "$DROVER_WAIT_FILE" ;;
esac`
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"spawn-1", "wait-1"} {
		if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "bad", "--type", "agent", "--id", id, "--param", "id=1")...); r.code != 0 {
			t.Fatalf("submit: %d %s", r.code, r.stderr)
		}
	}
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "bad", "--handler", "exec:sh "+script)...)
	for id, want := range map[string]string{"spawn-1": "DROVER_SPAWN_FILE children[0].queue", "wait-1": "DROVER_WAIT_FILE signal name"} {
		var view struct {
			Status    string `json:"current_status"`
			LastError string `json:"last_error"`
			Attempt   int    `json:"attempt"`
		}
		waitFor(t, 60*time.Second, id+" to end", func() bool {
			r := drover(t, append(etcdFlags(ns), "tasks", "get", id, "--json")...)
			_ = json.Unmarshal([]byte(r.stdout), &view)
			return view.Status == "DEAD"
		})
		if !strings.Contains(view.LastError, want) || view.Attempt != 1 {
			t.Fatalf("%s: %+v; want DEAD at its first attempt naming %s", id, view, want)
		}
		if h := drover(t, append(etcdFlags(ns), "task", "history", id)...); !strings.Contains(h.stdout, "no checkpoint yet") {
			t.Fatalf("%s history: %s %s", id, h.stdout, h.stderr)
		}
	}
	_ = w.cmd.Process.Signal(syscall.SIGTERM)
	w.wait(t, 30*time.Second)
}
