package cli_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/stream"
)

// TestTaskRunStepEmits: the steps of drover task run emit with drover
// emit, under the task's lock; the stream ends with done once the task
// completed, also when drover task run itself runs under a queue's claim
// (DROVER_QUEUE, DROVER_CLAIM_TOKEN); drover emit with a token the task
// is not held with stores nothing and exits 70.
func TestTaskRunStepEmits(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	// Run as a queue's exec handler would run it: the outer claim's
	// variables are not the steps' (their emits go under the task's lock).
	env := cleanEnv("DROVER_BIN="+droverBin, "DROVER_QUEUE=outer", "DROVER_CLAIM_TOKEN=7")
	r := droverEnv(t, env, append(etcdFlags(ns), "task", "run", "chat-2",
		"--step", `think="$DROVER_BIN" emit --type token --text Hel && "$DROVER_BIN" emit --type token --text lo && echo 1`,
		"--step", `answer="$DROVER_BIN" emit --type progress --data '{"done": 2}' && echo 2`)...)
	if r.code != 0 {
		t.Fatalf("task run: exit %d: %s", r.code, r.stderr)
	}
	f := drover(t, append(etcdFlags(ns), "tasks", "follow", "chat-2", "--json")...)
	var types []string
	var evs []stream.Event
	for _, line := range strings.Split(strings.TrimSpace(f.stdout), "\n") {
		var ev stream.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("follow: %q: %v (exit %d: %s)", line, err, f.code, f.stderr)
		}
		types, evs = append(types, ev.Type), append(evs, ev)
	}
	if got := fmt.Sprint(types); f.code != 0 || got != "[attempt_started token token progress done]" {
		t.Fatalf("follow: exit %d, %s: %s", f.code, got, f.stderr)
	}
	if string(evs[1].Data) != `{"text":"Hel"}` || !strings.Contains(string(evs[4].Data), `"succeeded"`) {
		t.Fatalf("events: %+v", evs)
	}
	stale := droverEnv(t, cleanEnv("DROVER_TASK_ID=chat-2", "DROVER_LOCK_TOKEN=1"), append(etcdFlags(ns), "emit", "--text", "late")...)
	if stale.code != 70 || !strings.Contains(stale.stderr, "not held with token 1") {
		t.Fatalf("emit with a stale token: exit %d: %s", stale.code, stale.stderr)
	}
	if f := drover(t, append(etcdFlags(ns), "tasks", "follow", "chat-2", "--json")...); strings.Count(f.stdout, "\n") != len(evs) {
		t.Fatalf("the stale emit stored something: %s", f.stdout)
	}
}
