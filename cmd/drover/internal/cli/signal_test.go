package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// drover signal: a signal to a task that does not wait yet is kept (the
// task shows it in tasks get); the same key again sends nothing; an
// unknown task exits 1, a bad name or data 2; a cancelled task exits 1.
func TestSignalCommand(t *testing.T) {
	ns := etcdtest.Namespace(t)
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "q", "--type", "agent", "--id", "plan-7")...); r.code != 0 {
		t.Fatalf("submit: %d %s", r.code, r.stderr)
	}
	r := drover(t, append(etcdFlags(ns), "signal", "plan-7", "approval", "--data", `{"approved":true}`, "--idempotency-key", "k1", "--json")...)
	var res struct {
		TaskID string `json:"task_id"`
		Stored bool   `json:"stored"`
		Woke   bool   `json:"woke"`
		Status string `json:"status"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &res); err != nil || r.code != 0 || !res.Stored || res.Woke || res.TaskID != "plan-7" || res.Status != "PENDING" {
		t.Fatalf("signal: %d %s %s (%v)", r.code, r.stdout, r.stderr, err)
	}
	if r = drover(t, append(etcdFlags(ns), "signal", "plan-7", "approval", "--idempotency-key", "k1")...); r.code != 0 || !strings.Contains(r.stdout, "nothing sent again") {
		t.Fatalf("the same signal again: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "plan-7")...)
	if r.code != 0 || !strings.Contains(r.stdout, "signals:") || !strings.Contains(r.stdout, "approval") || !strings.Contains(r.stdout, "waiting to be consumed") {
		t.Fatalf("tasks get: %d %s %s", r.code, r.stdout, r.stderr)
	}
	r = drover(t, append(etcdFlags(ns), "tasks", "get", "plan-7", "--json")...)
	var view struct {
		Signals []struct {
			Name     string          `json:"name"`
			Data     json.RawMessage `json:"data"`
			Consumed bool            `json:"consumed"`
		} `json:"signals"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &view); err != nil || len(view.Signals) != 1 || string(view.Signals[0].Data) != `{"approved":true}` {
		t.Fatalf("tasks get --json: %s (%v)", r.stdout, err)
	}
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"signal", "nobody", "approval"}, 1},
		{[]string{"signal", "plan-7", "bad/name"}, 2},
		{[]string{"signal", "plan-7", "approval", "--data", "{nope"}, 2},
		{[]string{"signal", "plan-7", "approval", "--idempotency-key", "a b"}, 2},
	} {
		if r := drover(t, append(etcdFlags(ns), tc.args...)...); r.code != tc.code {
			t.Fatalf("%v: exit %d, want %d: %s", tc.args, r.code, tc.code, r.stderr)
		}
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "cancel", "plan-7")...); r.code != 0 {
		t.Fatalf("cancel: %d %s", r.code, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "signal", "plan-7", "approval")...); r.code != 1 || !strings.Contains(r.stderr, "CANCELLED") {
		t.Fatalf("signal to a cancelled task: %d %s", r.code, r.stderr)
	}
}
