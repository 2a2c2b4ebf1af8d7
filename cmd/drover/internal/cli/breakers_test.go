package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// runs counts the handler's "ok" and "fail" lines per task.
func runs(t *testing.T, path string) (ok, fail map[string]int) {
	t.Helper()
	ok, fail = map[string]int{}, map[string]int{}
	f, err := os.Open(path)
	if err != nil {
		return ok, fail
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kind, id string
		var ts float64
		if _, err := fmt.Sscan(sc.Text(), &kind, &ts, &id); err != nil {
			continue
		}
		if kind == "ok" {
			ok[id]++
		} else {
			fail[id]++
		}
	}
	return ok, fail
}

// failsStarted counts the failed runs in the log at path that started
// within [from, to) (Unix seconds: the handler logs each run's start).
func failsStarted(t *testing.T, path string, from, to float64) int {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n := 0
	for _, line := range strings.Split(string(raw), "\n") {
		var kind, id string
		var ts float64
		if _, err := fmt.Sscan(line, &kind, &ts, &id); err == nil && kind == "fail" && ts >= from && ts < to {
			n++
		}
	}
	return n
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func breakerState(t *testing.T, ns string) string {
	t.Helper()
	r := drover(t, append(etcdFlags(ns), "breakers", "list", "--json")...)
	var bs []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &bs); err != nil || len(bs) != 1 {
		return ""
	}
	return bs[0].State
}

// TestBreakerHoldsFleetOff: three workers share a breaker (3 failures,
// cooldown 1 s). While the downstream is down the breaker opens and every
// worker holds off; once it is back a probe closes the breaker and every
// task succeeds. No task is charged a retry for being held off: each task's
// retries_attempted is exactly the number of its runs that failed.
func TestBreakerHoldsFleetOff(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "b", "sync", 30, `,"max_retries":20`)
	dir := t.TempDir()
	down, log := filepath.Join(dir, "down"), filepath.Join(dir, "runs")
	if err := os.WriteFile(down, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// Each run logs its start time, so that runs already going when the
	// breaker opened are told from those it let through.
	handler := fmt.Sprintf(`exec:start=$(date +%%s.%%N); in=$(cat); id=$(printf '%%s' "$in" | sed 's/.*"task_id":"\([^"]*\)".*/\1/'); `+
		`if [ -e %s ]; then echo "fail $start $id" >> %s; exit 1; fi; echo "ok $start $id" >> %s`, down, log, log)
	ws := startWorkers(t, ns, 3, "--queue", "b", "--concurrency", "2", "--drain",
		"--backoff-base", "100ms", "--backoff-max", "200ms", "--breaker", "crm;failures=3;cooldown=1s", "--handler", handler)
	waitFor(t, 20*time.Second, "the breaker to open", func() bool { return breakerState(t, ns) == "open" })
	seen := float64(time.Now().UnixNano()) / 1e9
	_, fail := runs(t, log)
	openedAfter := total(fail)
	time.Sleep(2500 * time.Millisecond) // down for two more cooldowns
	// Runs that started after the open state was seen: the probes the
	// breaker let through (runs already going then finish later, and are
	// not its to hold off).
	heldOff := failsStarted(t, log, seen, seen+2.5)
	t.Logf("%d failed runs until the breaker opened, %d started in the next 2.5 s (probes)", openedAfter, heldOff)
	// 3 counted failures, at most 6 more already running, and a probe or
	// two if noticing the open state took this test past a cooldown.
	if openedAfter > 3+6+2 {
		t.Fatalf("%d failed runs before the breaker opened: 3 failures plus at most 6 in flight (and 2 probes)", openedAfter)
	}
	if heldOff > 4 {
		t.Fatalf("%d failed runs in 2.5 s while open with a 1 s cooldown: the fleet was not held off", heldOff)
	}
	if err := os.Remove(down); err != nil {
		t.Fatal(err)
	}
	waitWorkers(t, ws, 60*time.Second)
	if s := breakerState(t, ns); s != "closed" {
		t.Fatalf("breaker %s after the downstream recovered", s)
	}
	ok, fail := runs(t, log)
	if len(ok) != 30 {
		t.Fatalf("%d tasks succeeded, want 30", len(ok))
	}
	r := drover(t, append(etcdFlags(ns), "tasks", "list", "--queue", "b", "--status", "SUCCEEDED", "--limit", "100", "--json")...)
	var tasks []struct {
		ID      string `json:"task_id"`
		Retries int    `json:"retries_attempted"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &struct{ Tasks any }{&tasks}); err != nil || len(tasks) != 30 {
		t.Fatalf("tasks list: %d tasks, %v: %s", len(tasks), err, r.stdout)
	}
	for _, tk := range tasks {
		if tk.Retries != fail[tk.ID] {
			t.Fatalf("task %s: %d retries charged, %d failed runs: held-off time was charged", tk.ID, tk.Retries, fail[tk.ID])
		}
	}
	if r := drover(t, append(etcdFlags(ns), "breakers", "reset", "crm")...); r.code != 0 || !strings.Contains(r.stdout, "closed") {
		t.Fatalf("breakers reset: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "breakers", "list")...)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "BREAKER STATE FAILURES OPENS AT COOLDOWN TIMES OPENED" ||
		!strings.HasPrefix(strings.Join(strings.Fields(lines[1]), " "), "crm closed 0 3 1s ") {
		t.Fatalf("breakers list:\n%s", r.stdout)
	}
}
