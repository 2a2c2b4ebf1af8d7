package httpapi_test

import (
	"strings"
	"testing"
	"time"
)

// TestQueueDelayedTasks: over HTTP, run_at and delay make SCHEDULED tasks
// (stats, list, get), a claim takes one only once due (its claim's time is
// not before its due time), cancel works on one, and bad values get a 400
// problem naming the field with nothing stored.
func TestQueueDelayedTasks(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	for _, c := range []struct{ name, body, field string }{
		{"both", `[{"task_id":"b1","task_type":"x","run_at":"2030-01-01T00:00:00Z","delay":"1m"}]`, "run_at"},
		{"negative delay", `[{"task_id":"b2","task_type":"x","delay":"-1m"}]`, "delay"},
		{"bad time", `[{"task_id":"b3","task_type":"x","run_at":"tomorrow"}]`, "run_at"},
		{"bad delay", `[{"task_id":"b4","task_type":"x","delay":"soon"}]`, "delay"},
	} {
		before := a.keyCount()
		r := a.do("POST", "/v1/queues/later/tasks", c.body).problem(t, 400)
		if !strings.Contains(string(r.Raw), c.field) {
			t.Errorf("%s: the problem does not name %s: %s", c.name, c.field, r.Raw)
		}
		if after := a.keyCount(); after != before {
			t.Errorf("%s: keys %d → %d", c.name, before, after)
		}
	}
	runAt := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	a.do("POST", "/v1/queues/later/tasks", `[{"task_id":"h","task_type":"x","run_at":"`+runAt+`"},{"task_id":"s","task_type":"x","delay":"300ms"}]`).want(t, 200)
	st := a.do("GET", "/v1/queues/later/stats", nil).want(t, 200)
	if st.num("scheduled") != 2 || st.num("pending") != 0 {
		t.Fatalf("stats %s, want 2 scheduled", st.Raw)
	}
	list := a.do("GET", "/v1/queues/later/tasks?status=SCHEDULED", nil).want(t, 200)
	tasks, _ := list.JSON["tasks"].([]any)
	if len(tasks) != 2 {
		t.Fatalf("list SCHEDULED: %s", list.Raw)
	}
	due := map[string]time.Time{}
	for _, x := range tasks {
		m := x.(map[string]any)
		at, err := time.Parse(time.RFC3339Nano, m["scheduled_at"].(string))
		if err != nil || m["current_status"] != "SCHEDULED" {
			t.Fatalf("listed %v (%v)", m, err)
		}
		due[m["task_id"].(string)] = at
	}
	if due["h"].Format(time.RFC3339) != runAt {
		t.Fatalf("h falls due at %v, want %s", due["h"], runAt)
	}
	a.do("POST", "/v1/queues/later/tasks/h/cancel", nil).want(t, 200)
	sess := a.session(30)
	var claimed []map[string]any
	for try := 0; len(claimed) == 0 && try < 10; try++ { // a guard: each waits up to 10 s
		claimed = a.qclaim("later", sess, 5, "10s")
	}
	if len(claimed) != 1 || claimed[0]["task_id"] != "s" {
		t.Fatalf("claimed %v, want s alone", claimed)
	}
	got := a.do("GET", "/v1/queues/later/tasks/s", nil).want(t, 200)
	trs := got.JSON["transitions"].([]any)
	last := trs[len(trs)-1].(map[string]any)
	at, _ := time.Parse(time.RFC3339Nano, last["at"].(string))
	if last["status"] != "RUNNING" || at.Before(due["s"]) {
		t.Fatalf("s claimed at %v (%v), before its due time %v", at, last, due["s"])
	}
	if st := a.do("GET", "/v1/queues/later/stats", nil).want(t, 200); st.num("scheduled") != 0 || st.num("cancelled") != 1 {
		t.Fatalf("stats at the end %s", st.Raw)
	}
}
