package cli_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// drover task run, exec steps that wait for a signal: step 1 writes the
// wait to DROVER_WAIT_FILE; the run checkpoints it and exits 75 holding
// nothing; a run before the signal runs nothing and exits 75 again;
// once drover signal sent it, the next run resumes at step 2, which reads
// the signal from DROVER_SIGNAL_FILE and DROVER_SIGNAL_NAME. Each step
// runs once (a log the steps write counts them). A bad signal name in the
// wait file fails the step, naming the file and the rule, and checkpoints
// nothing.
func TestTaskRunExecStepWaitsForSignal(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	log := filepath.Join(dir, "steps.log")
	plan := `echo plan >> ` + log + `; printf drafted; echo "approve,reject 1h" > "$DROVER_WAIT_FILE"`
	act := `echo act >> ` + log + `; printf '%s|%s|' "$(cat)" "$DROVER_SIGNAL_NAME"; cat "$DROVER_SIGNAL_FILE"`
	run := func() result {
		return drover(t, append(etcdFlags(ns), "task", "run", "appr-1", "--step", "plan="+plan, "--step", "act="+act)...)
	}
	r := run()
	if r.code != 75 || !strings.Contains(r.stderr, "waits for signal approve or reject until") {
		t.Fatalf("first run: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r = run(); r.code != 75 {
		t.Fatalf("a run before the signal: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if s := drover(t, append(etcdFlags(ns), "signal", "appr-1", "approve", "--data", `{"by":"ana"}`, "--idempotency-key", "k1")...); s.code != 0 {
		t.Fatalf("signal: %d %s %s", s.code, s.stdout, s.stderr)
	}
	r = run()
	if r.code != 0 || !strings.HasPrefix(r.stdout, "drafted|approve|") || !strings.Contains(r.stdout, `"data":{"by":"ana"}`) || !strings.Contains(r.stdout, `"idempotency_key":"k1"`) {
		t.Fatalf("run after the signal: %d %q %q", r.code, r.stdout, r.stderr)
	}
	b, _ := os.ReadFile(log)
	if got := strings.Fields(string(b)); strings.Join(got, " ") != "plan act" {
		t.Fatalf("steps ran %v; want plan then act, once each", got)
	}

	bad := drover(t, append(etcdFlags(ns), "task", "run", "appr-2", "--step", `a=echo "not-ok! 1h" > "$DROVER_WAIT_FILE"`, "--step", "b=true")...)
	if bad.code == 0 || bad.code == 75 || !strings.Contains(bad.stderr, "DROVER_WAIT_FILE") || !strings.Contains(bad.stderr, "signal name") {
		t.Fatalf("a bad signal name: %d %q %q", bad.code, bad.stdout, bad.stderr)
	}
	if h := drover(t, append(etcdFlags(ns), "task", "history", "appr-2")...); h.code != 0 || !strings.Contains(h.stdout, "no checkpoint yet") {
		t.Fatalf("history after a refused wait: %s", h.stdout)
	}
}
