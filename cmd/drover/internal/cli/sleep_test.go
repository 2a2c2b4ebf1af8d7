package cli_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// sleepScript is an exec handler whose task is three steps: step 1 prints
// s1 and sleeps 1 s, step 2 appends s2 and sleeps 1 s again (blocking first
// in a worker started with BLOCK=1), step 3 appends s3 and ends the task.
// Each run logs "step N pid" when it starts.
const sleepScript = `echo "$DROVER_STEP $$" >> "$LOG"
case "$DROVER_STEP" in
1) printf s1; echo 1s > "$DROVER_SLEEP_FILE" ;;
2) if [ -n "$BLOCK" ]; then exec sleep 120; fi; printf '%s|s2' "$(cat "$DROVER_STATE_FILE")"; echo 1 > "$DROVER_SLEEP_FILE" ;;
3) printf '%s|s3' "$(cat "$DROVER_STATE_FILE")" ;;
esac`

// A drover worker process SIGKILLed while it resumes a sleeping exec step
// task: another worker finishes the task, step 1 (checkpointed before the
// sleep) never runs again, only step 2 (in flight at the kill) runs twice,
// and the second sleep parks and resumes as the first did.
func TestWorkerKilledWhileResumingSleepingTask(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	log, script := filepath.Join(dir, "steps.log"), filepath.Join(dir, "steps.sh")
	if err := os.WriteFile(script, []byte(sleepScript), 0o755); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "naps", "--type", "agent", "--id", "nap-1", "--param", "id=1")...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	worker := func(extra ...string) *process {
		args := append(etcdFlags(ns), "worker", "--queue", "naps", "--ttl", "2s", "--handler", "exec:sh "+script)
		// Not --drain: a draining worker does not wait for a sleeping task.
		return start(t, cleanEnv(append([]string{"LOG=" + log}, extra...)...), args...)
	}
	runs := func() []string {
		b, _ := os.ReadFile(log)
		return strings.Split(strings.TrimSpace(string(b)), "\n")
	}
	victim := worker("BLOCK=1")
	waitFor(t, 60*time.Second, "the victim to resume the task at step 2", func() bool {
		r := runs()
		return len(r) >= 2 && strings.HasPrefix(r[len(r)-1], "2 ")
	})
	_ = victim.cmd.Process.Signal(syscall.SIGKILL)
	victim.wait(t, 30*time.Second)
	rescuer := worker()
	if r := drover(t, append(etcdFlags(ns), "tasks", "wait", "nap-1", "--timeout", "90s")...); r.code != 0 {
		t.Fatalf("tasks wait: %d %s %s; rescuer: %s", r.code, r.stdout, r.stderr, rescuer.stderr.String())
	}
	_ = rescuer.cmd.Process.Signal(syscall.SIGTERM)
	if code := rescuer.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("rescuer exit %d: %s", code, rescuer.stderr.String())
	}
	var steps []string
	for _, r := range runs() {
		steps = append(steps, strings.Fields(r)[0])
	}
	if got := strings.Join(steps, " "); got != "1 2 2 3" {
		t.Fatalf("steps ran %q; want step 1 once, step 2 twice (in flight at the kill), step 3 once", got)
	}
	r := drover(t, append(etcdFlags(ns), "tasks", "list", "--queue", "naps", "--status", "SUCCEEDED", "--json")...)
	var page struct {
		Tasks []struct {
			Result  json.RawMessage `json:"result"`
			Attempt int             `json:"attempt"`
		} `json:"tasks"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &page); err != nil || len(page.Tasks) != 1 {
		t.Fatalf("list: %v %s %s", err, r.stdout, r.stderr)
	}
	if got := string(page.Tasks[0].Result); got != `"s1|s2|s3"` || page.Tasks[0].Attempt != 2 {
		t.Fatalf("result %s attempt %d: want s1|s2|s3 after two attempts (the kill counts, the sleeps do not)", got, page.Tasks[0].Attempt)
	}
}

// drover task run: a shell step that writes DROVER_SLEEP_FILE ends the run
// with exit 75 and nothing held; a run before the sleep ends runs nothing;
// one after it resumes at the next step.
func TestTaskRunStepSleeps(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "runs.log")
	args := append(etcdFlags(ns), "task", "run", "nap", "--ttl", "5s",
		"--step", "plan=echo plan >> "+log+"; printf p; echo 1s > \"$DROVER_SLEEP_FILE\"",
		"--step", "act=echo act >> "+log+"; cat; printf a")
	r := drover(t, args...)
	if r.code != 75 || !strings.Contains(r.stderr, "sleeps until") {
		t.Fatalf("first run: exit %d, stderr %s; want 75 saying until when", r.code, r.stderr)
	}
	at := strings.Fields(r.stderr[strings.LastIndex(r.stderr, "sleeps until ")+len("sleeps until "):])[0]
	until, err := time.Parse(time.RFC3339Nano, strings.TrimSuffix(at, ";"))
	if err != nil {
		t.Fatalf("until %q: %v", at, err)
	}
	if early := drover(t, append(args, "--json")...); time.Now().Before(until.Add(-50 * time.Millisecond)) {
		if early.code != 75 || !strings.Contains(early.stdout, `"sleeping_until"`) {
			t.Fatalf("early run: exit %d, %s %s; want 75 and nothing run", early.code, early.stdout, early.stderr)
		}
	}
	time.Sleep(time.Until(until) + 10*time.Millisecond)
	done := drover(t, args...)
	if done.code != 0 || done.stdout != "pa" {
		t.Fatalf("run after the sleep: exit %d, stdout %q, stderr %s", done.code, done.stdout, done.stderr)
	}
	b, _ := os.ReadFile(log)
	if got := strings.Fields(string(b)); strings.Join(got, " ") != "plan act" {
		t.Fatalf("steps ran %q, want plan once, act once", got)
	}
}
