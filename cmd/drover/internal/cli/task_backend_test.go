package cli_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
)

// TestTaskRunOnLockBackends runs drover task run with its lock on a real
// Paxos group of drover paxos serve nodes and on a real Redis: a failed
// step, a resume after it, a second worker that waits its turn and finds
// the task completed, the history, and the lock freed at the end.
func TestTaskRunOnLockBackends(t *testing.T) {
	backends := map[string]string{
		"paxos": "paxos://" + startPaxosNodes(t, 3).endpoints(),
		"redis": "redis://" + servicetest.Redis(t) + "/0",
	}
	for name, backend := range backends {
		t.Run(name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			flags := append(etcdFlags(ns), "--lock-backend", backend)
			run := func(extra ...string) []string {
				return append(append([]string{"task", "run", "job", "--ttl", "2s", "--step", "a=printf A"}, extra...), flags...)
			}
			r := drover(t, run("--step", "b=cat; exit 3")...)
			if r.code != 1 || !strings.Contains(r.stderr, "step 2 (b)") {
				t.Fatalf("failing step: exit %d, stderr %q", r.code, r.stderr)
			}
			if h := taskHistory(t, etcdFlags(ns), "job"); h.Step != 1 || h.Completed {
				t.Fatalf("after a failed step 2: %+v", h)
			}
			// One worker holds the task through a slow step 2; another
			// started meanwhile waits, then finds it completed.
			first := start(t, cleanEnv(), run("--worker-id", "first", "--json", "--step", `b=sleep 1; cat; printf "B$DROVER_LOCK_TOKEN"`)...)
			waitFor(t, 20*time.Second, "the first worker to hold the task", func() bool { return strings.Contains(first.stderr.String(), "step 2/2 b: started") })
			second := drover(t, run("--worker-id", "second", "--step", "b=printf never")...)
			if second.code != 0 || !strings.Contains(second.stderr, "waiting for it (polling its lock)") || !strings.Contains(second.stderr, "already completed") {
				t.Fatalf("second worker: exit %d, stderr %q", second.code, second.stderr)
			}
			if code := first.wait(t, 20*time.Second); code != 0 {
				t.Fatalf("first worker: exit %d, stderr %q", code, first.stderr.String())
			}
			var res struct {
				Token       int64  `json:"token"`
				ResumedFrom int    `json:"resumed_from_step"`
				State       string `json:"state"`
			}
			if err := json.Unmarshal([]byte(first.stdout.String()), &res); err != nil || res.ResumedFrom != 2 || !strings.HasPrefix(res.State, "AB") || res.State[2:] != strconv.FormatInt(res.Token, 10) {
				t.Fatalf("first worker's result %q (%v): want a resume at step 2 whose step saw the token", first.stdout.String(), err)
			}
			h := taskHistory(t, etcdFlags(ns), "job")
			if !h.Completed || len(h.History) != 2 || h.History[1].Worker != "first" || h.History[1].Token != res.Token || h.History[1].Token <= h.History[0].Token {
				t.Fatalf("history: %+v", h)
			}
			if st := drover(t, append([]string{"lock", "status", "task:job", "--json"}, flags...)...); st.code != 0 || !strings.Contains(st.stdout, `"held":false`) {
				t.Fatalf("the task's lock after the runs: exit %d, %q %q", st.code, st.stdout, st.stderr)
			}
		})
	}
}

// TestTaskRunLockBackendHelp checks --help documents --lock-backend with an
// example, and a bad value is refused before etcd is contacted.
func TestTaskRunLockBackendHelp(t *testing.T) {
	r := drover(t, "task", "run", "--help")
	if r.code != 0 || !strings.Contains(r.stdout, "--lock-backend") || !strings.Contains(r.stdout, "--lock-backend paxos://") {
		t.Fatalf("task run --help: exit %d, %q", r.code, r.stdout)
	}
	r = drover(t, "task", "run", "job", "--step", "a=true", "--lock-backend", "zookeeper://x", "--etcd-endpoints", "127.0.0.1:1", "--dial-timeout", "30s")
	if r.code != 2 || !strings.Contains(r.stderr, "--lock-backend") {
		t.Fatalf("bad --lock-backend: exit %d, %q", r.code, r.stderr)
	}
}
