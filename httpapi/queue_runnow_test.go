package httpapi_test

import (
	"strings"
	"testing"
)

// TestQueueRunNow: the run-now routes make one scheduled task, the named
// ones, then every one due now (moved counts them, a worker claims them);
// a task that is not scheduled is 404 naming what to do, a bad id a 400
// naming body.ids[i], and an unknown queue 404.
func TestQueueRunNow(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/rn/tasks", `[{"task_id":"rn-a","task_type":"x","delay":"1h"},{"task_id":"rn-b","task_type":"x","delay":"1h"},`+
		`{"task_id":"rn-c","task_type":"x","delay":"2h"},{"task_id":"rn-d","task_type":"x","delay":"3h"},{"task_id":"rn-p","task_type":"x"}]`).want(t, 200)
	if r := a.do("POST", "/v1/queues/rn/tasks/rn-a/run-now", nil).want(t, 200); r.num("moved") != 1 {
		t.Fatalf("run-now rn-a: %s", r.Raw)
	}
	r := a.do("POST", "/v1/queues/rn/tasks/rn-a/run-now", nil).problem(t, 404)
	if !strings.Contains(string(r.Raw), "PENDING") || !strings.Contains(string(r.Raw), "GET /v1/queues/rn/tasks/rn-a") {
		t.Fatalf("run-now of a pending task: %s", r.Raw)
	}
	a.do("POST", "/v1/queues/other/tasks/rn-b/run-now", nil).problem(t, 404)
	a.do("POST", "/v1/queues/rn/tasks/nope/run-now", nil).problem(t, 404)
	a.do("POST", "/v1/queues/never-used/tasks/run-now", nil).problem(t, 404)
	if r := a.do("POST", "/v1/queues/rn/tasks/run-now", `{"ids":["rn-b","a b"]}`).problem(t, 400); !strings.Contains(string(r.Raw), "body.ids[1]") {
		t.Fatalf("bad id: %s", r.Raw)
	}
	a.do("POST", "/v1/queues/rn/tasks/run-now", `{"ids":["rn-p"]}`).problem(t, 409)
	if r := a.do("POST", "/v1/queues/rn/tasks/run-now", `{"ids":["rn-b"]}`).want(t, 200); r.num("moved") != 1 {
		t.Fatalf("run-now [rn-b]: %s", r.Raw)
	}
	if r := a.do("POST", "/v1/queues/rn/tasks/run-now", nil).want(t, 200); r.num("moved") != 2 {
		t.Fatalf("run-now of every one: %s", r.Raw)
	}
	if r := a.do("POST", "/v1/queues/rn/tasks/run-now", `{}`).want(t, 200); r.num("moved") != 0 {
		t.Fatalf("run-now with none left: %s", r.Raw)
	}
	if st := a.do("GET", "/v1/queues/rn/stats", nil).want(t, 200); st.num("scheduled") != 0 || st.num("pending") != 5 {
		t.Fatalf("stats %s, want 5 pending", st.Raw)
	}
	sess := a.session(30)
	got := map[string]bool{}
	for try := 0; len(got) < 5 && try < 10; try++ {
		for _, c := range a.qclaim("rn", sess, 5, "10s") {
			got[c["task_id"].(string)] = true
		}
	}
	if len(got) != 5 {
		t.Fatalf("claimed %v, want the 5", got)
	}
}

// TestQueueRunNowRoles: a read token may not run a scheduled task now
// (403, nothing changed); a write token may, one task or every one.
func TestQueueRunNowRoles(t *testing.T) {
	t.Parallel()
	a := authAPI(t)
	a.token = writeTok
	a.do("POST", "/v1/queues/rr/tasks", `[{"task_id":"rr-a","task_type":"x","delay":"1h"},{"task_id":"rr-b","task_type":"x","delay":"1h"}]`).want(t, 200)
	a.token = readTok
	a.do("POST", "/v1/queues/rr/tasks/rr-a/run-now", nil).problem(t, 403)
	a.do("POST", "/v1/queues/rr/tasks/run-now", nil).problem(t, 403)
	if st := a.do("GET", "/v1/queues/rr/stats", nil).want(t, 200); st.num("scheduled") != 2 {
		t.Fatalf("a refused run-now changed the queue: %s", st.Raw)
	}
	a.token = writeTok
	if r := a.do("POST", "/v1/queues/rr/tasks/rr-a/run-now", nil).want(t, 200); r.num("moved") != 1 {
		t.Fatalf("run-now rr-a: %s", r.Raw)
	}
	if r := a.do("POST", "/v1/queues/rr/tasks/run-now", map[string]any{"ids": []string{}}).want(t, 200); r.num("moved") != 1 {
		t.Fatalf("run-now of every one: %s", r.Raw)
	}
}
