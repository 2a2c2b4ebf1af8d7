package httpapi_test

import (
	"testing"
)

// TestAgentTaskSleepingStepRepeated: a step write that sleeps releases
// the claim; the same write sent again (its answer was lost) is answered
// as before, not refused for the claim it gave up. So is a repeat of the
// write that completed the task.
func TestAgentTaskSleepingStepRepeated(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("napper", s, 200).num("token")
	body := map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("st"), "sleep_for": "1h"}
	first := a.do("PUT", "/v1/agent-tasks/napper/steps/1", body).want(t, 200)
	if first.str("sleep_until") == "" {
		t.Fatalf("no sleep_until: %s", first.Raw)
	}
	again := a.do("PUT", "/v1/agent-tasks/napper/steps/1", body).want(t, 200)
	if again.str("sleep_until") != first.str("sleep_until") {
		t.Fatalf("repeat answered %s, first %s", again.Raw, first.Raw)
	}
	other := map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("other"), "sleep_for": "1h"}
	a.do("PUT", "/v1/agent-tasks/napper/steps/1", other).problem(t, 409)

	tok = a.claim("done-once", s, 200).num("token")
	last := map[string]any{"session": s, "token": tok, "steps": 1, "state": b64("r")}
	a.do("PUT", "/v1/agent-tasks/done-once/steps/1", last).want(t, 200)
	if r := a.do("PUT", "/v1/agent-tasks/done-once/steps/1", last).want(t, 200); r.JSON["completed"] != true {
		t.Fatalf("repeat of the completing write: %s", r.Raw)
	}
}
