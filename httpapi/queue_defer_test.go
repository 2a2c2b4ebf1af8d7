package httpapi_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/droverhq/drover/metrics"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestQueueOutcomeDefer: an outcome defer hands a claimed task back unrun,
// as a Go worker's budget gate does: PENDING, no attempt spent, its
// history and budget_wait saying which budget it waits for and why, and
// drover_budget_task_deferrals_total counting it. A deferral in a row
// (from the task's own record) counts again without a second history
// entry; the outcome that ends its wait clears budget_wait. A reason that
// names no budget (or another one) defers all the same, but is no budget
// wait.
func TestQueueOutcomeDefer(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const key = "openai/defer-route/key-a"
	tasks := qtasksJSON("qd", 3)
	for _, tk := range tasks {
		tk["metadata"] = map[string]any{"budget": key, "estimated_tokens": 100}
	}
	a.do("POST", "/v1/queues/qd/tasks", tasks).want(t, 200)
	sess := a.session(30)
	got := a.qclaim("qd", sess, 3, "")
	if len(got) != 3 {
		t.Fatalf("claimed %v", got)
	}
	byID := map[string]map[string]any{}
	for _, tk := range got {
		byID[tk["task_id"].(string)] = tk
	}
	waits, other, soon := byID["qd-0"], byID["qd-1"], byID["qd-2"]
	counted := testutil.ToFloat64(metrics.BudgetTaskDeferrals.WithLabelValues(key))
	reason := "budget " + key + ": 5 requests of 5 used in this window"
	res := a.qreport("qd", sess,
		qoutcome(waits, "defer", map[string]any{"after": "1h", "reason": reason}),
		qoutcome(other, "defer", map[string]any{"after": "1h", "reason": "budget other/key: no room"}),
		qoutcome(soon, "defer", map[string]any{"after": "0", "reason": reason}))
	wantResults(t, res, "200 PENDING", "200 PENDING", "200 PENDING")
	if res[0]["scheduled_at"] == nil {
		t.Errorf("a deferred task's result has no scheduled_at: %v", res[0])
	}
	if n := testutil.ToFloat64(metrics.BudgetTaskDeferrals.WithLabelValues(key)) - counted; n != 2 {
		t.Errorf("drover_budget_task_deferrals_total{budget=%q} rose by %v, want 2 (another budget's reason does not count)", key, n)
	}
	r := a.do("GET", "/v1/queues/qd/tasks/qd-0", nil).want(t, 200)
	bw, _ := r.JSON["budget_wait"].(map[string]any)
	// RETRYING while its delay runs, as a Go worker's deferral shows it.
	if st := r.str("current_status"); st != "PENDING" && st != "RETRYING" || r.num("attempt") != 0 || bw == nil || bw["budget"] != key || bw["reason"] != reason || bw["deferrals"] != 1.0 {
		t.Fatalf("a task deferred for its budget: %s, want it waiting, attempt 0, budget_wait for %s", r.Raw, key)
	}
	if !strings.Contains(string(r.Raw), "deferred: "+reason) {
		t.Errorf("the history does not record the deferral's reason: %s", r.Raw)
	}
	if r := a.do("GET", "/v1/queues/qd/tasks/qd-1", nil).want(t, 200); r.JSON["budget_wait"] != nil || r.num("attempt") != 0 {
		t.Errorf("a deferral for another budget than the task's: %s, want no budget_wait", r.Raw)
	}
	// The one deferred for 0 comes back at once, its attempt still the first.
	again := a.qclaim("qd", sess, 1, "20s")
	if len(again) != 1 || again[0]["task_id"] != "qd-2" || again[0]["attempt"] != 1.0 {
		t.Fatalf("claimed %v after a deferral of 0, want qd-2 at attempt 1", again)
	}
	wantResults(t, a.qreport("qd", sess, qoutcome(again[0], "defer", map[string]any{"after": "0.1", "reason": reason})), "200 PENDING")
	r = a.do("GET", "/v1/queues/qd/tasks/qd-2", nil).want(t, 200)
	if bw, _ := r.JSON["budget_wait"].(map[string]any); bw == nil || bw["deferrals"] != 2.0 || strings.Count(string(r.Raw), "deferred: ") != 1 {
		t.Fatalf("a deferral in a row: %s, want deferrals 2 and one history entry", r.Raw)
	}
	again = a.qclaim("qd", sess, 1, "20s")
	if len(again) != 1 || again[0]["task_id"] != "qd-2" || again[0]["attempt"] != 1.0 {
		t.Fatalf("claimed %v after two deferrals, want qd-2 at attempt 1", again)
	}
	wantResults(t, a.qreport("qd", sess, qoutcome(again[0], "error", "flaky")), "200 RETRYING")
	if r := a.do("GET", "/v1/queues/qd/tasks/qd-2", nil).want(t, 200); r.JSON["budget_wait"] != nil {
		t.Errorf("a task run after its wait still shows it: %s", r.Raw)
	}
}

// TestQueueOutcomeDeferBadInput: a deferral with another outcome, no
// reason, or a delay out of bounds is a 400 naming the field, and nothing
// is written.
func TestQueueOutcomeDeferBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/qdbad/tasks", qtasksJSON("qdbad", 1)).want(t, 200)
	sess := a.session(30)
	tk := a.qclaim("qdbad", sess, 1, "")[0]
	d := func(after, reason string) map[string]any { return map[string]any{"after": after, "reason": reason} }
	cases := []struct {
		name, field string
		o           map[string]any
	}{
		{"with error", "body.outcomes[0].defer", qoutcome(tk, "error", "e", "defer", d("1s", "x"))},
		{"with sleep", "body.outcomes[0].defer", qoutcome(tk, "sleep_for", "1s", "defer", d("1s", "x"))},
		{"blank reason", "body.outcomes[0].defer.reason", qoutcome(tk, "defer", d("1s", "  "))},
		{"no reason", "body.outcomes[0].defer", qoutcome(tk, "defer", map[string]any{"after": "1s"})},
		{"long reason", "body.outcomes[0].defer.reason", qoutcome(tk, "defer", d("1s", strings.Repeat("x", 1025)))},
		{"negative", "body.outcomes[0].defer.after", qoutcome(tk, "defer", d("-1s", "x"))},
		{"over a day", "body.outcomes[0].defer.after", qoutcome(tk, "defer", d("25h", "x"))},
		{"a time", "body.outcomes[0].defer.after", qoutcome(tk, "defer", d("2030-01-01T00:00:00Z", "x"))},
	}
	for _, c := range cases {
		before := a.keyCount()
		p := a.do("POST", "/v1/queues/qdbad/outcomes", map[string]any{"session": sess, "outcomes": []any{c.o}}).problem(t, 400)
		if !strings.Contains(string(p.Raw), c.field) {
			t.Errorf("%s: %s, want it to name %s", c.name, p.Raw, c.field)
		}
		if after := a.keyCount(); after != before {
			t.Errorf("%s: keys %d → %d", c.name, before, after)
		}
	}
	// Nothing was written: the claim still holds.
	wantResults(t, a.qreport("qdbad", sess, qoutcome(tk)), "200 SUCCEEDED")
}

// TestQueueOutcomeDeferFenced: a deferral is fenced by its claim's token
// as the other outcomes are: a token the claim never had, a claim whose
// outcome was written already, and a stale claim of a task claimed again
// since each get a 409 and write nothing. In one batch beside a success
// and a failure of the same segment, each outcome is written as its own.
func TestQueueOutcomeDeferFenced(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/qdf/tasks", qtasksJSON("qdf", 3)).want(t, 200)
	sess := a.session(30)
	got := a.qclaim("qdf", sess, 3, "")
	if len(got) != 3 {
		t.Fatalf("claimed %v", got)
	}
	byID := map[string]map[string]any{}
	for _, tk := range got {
		byID[tk["task_id"].(string)] = tk
	}
	d := map[string]any{"after": "0", "reason": "quota q full"}
	wrong := map[string]any{"task_id": "qdf-0", "token": byID["qdf-0"]["token"].(float64) + 1000}
	before := a.keyCount()
	wantResults(t, a.qreport("qdf", sess, qoutcome(wrong, "defer", d)), "409")
	if after := a.keyCount(); after != before {
		t.Errorf("a deferral under a wrong token: keys %d → %d", before, after)
	}
	wantResults(t, a.qreport("qdf", sess,
		qoutcome(byID["qdf-0"], "defer", d),
		qoutcome(byID["qdf-1"]),
		qoutcome(byID["qdf-2"], "error", "flaky")), "200 PENDING", "200 SUCCEEDED", "200 RETRYING")
	// The same deferral again: the claim ended with the first.
	wantResults(t, a.qreport("qdf", sess, qoutcome(byID["qdf-0"], "defer", d)), "409")
	// qdf-0 comes back at its next attempt, before or after qdf-2's retry.
	redo := claimBack(t, a, "qdf", sess, "qdf-0", "qdf-2")
	if redo["attempt"] != 1.0 {
		t.Fatalf("claimed %v after a deferral, want qdf-0 at attempt 1", redo)
	}
	// The first claim's token is stale now: its deferral is refused and
	// the new claim's outcome still counts.
	wantResults(t, a.qreport("qdf", sess, qoutcome(byID["qdf-0"], "defer", d)), "409")
	r := a.do("GET", "/v1/queues/qdf/tasks/qdf-0", nil).want(t, 200)
	if r.str("current_status") != "RUNNING" || strings.Count(string(r.Raw), "deferred: ") != 1 {
		t.Fatalf("after a stale deferral: %s, want RUNNING under the new claim, one deferral", r.Raw)
	}
	wantResults(t, a.qreport("qdf", sess, qoutcome(redo)), "200 SUCCEEDED")
}

// claimBack claims from queue q under sess until task want comes back,
// and returns its claim. The deferred task is due after 100 ms, and the
// retried one (other) after a backoff drawn from 0 to 1 s: either may
// be claimable first, and a claim answers with the tasks claimable when
// one is, not waiting for max. So it claims again, at most once per task
// that can come back, each claim waiting (up to the server's longest wait)
// for one; a claim that finds none, or a task not expected, fails.
func claimBack(t *testing.T, a *api, q, sess, want, other string) map[string]any {
	t.Helper()
	var seen []string
	for range 2 {
		got := a.qclaim(q, sess, 2, "20s")
		if len(got) == 0 {
			break
		}
		var found map[string]any
		for _, tk := range got {
			id, _ := tk["task_id"].(string)
			if id != want && id != other || slices.Contains(seen, id) {
				t.Fatalf("claimed %v, want only %s and %s, each once (claimed %v before)", got, want, other, seen)
			}
			seen = append(seen, id)
			if id == want {
				found = tk
			}
		}
		if found != nil {
			return found
		}
	}
	t.Fatalf("%s was not claimed again (claimed %v), want it back after its deferral", want, seen)
	return nil
}

// TestQueueOutcomeDeferEndsItsStream: a deferral sent with streamed ends
// the attempt's stream with attempt_ended (the task runs again later),
// as a failure to retry and a sleep do.
func TestQueueOutcomeDeferEndsItsStream(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/qds/tasks", qtasksJSON("qds", 1)).want(t, 200)
	sess := a.session(30)
	tk := a.qclaim("qds", sess, 1, "5s")[0]
	a.do("POST", "/v1/tasks/qds-0/stream/events",
		qfence(sess, tk, "events", []any{map[string]any{"type": "token", "data": map[string]any{"text": "x"}}})).want(t, 200)
	wantResults(t, a.qreport("qds", sess, qoutcome(tk, "defer", map[string]any{"after": "1h", "reason": "quota q full"}, "streamed", true)), "200 PENDING")
	if _, types := a.sseEvents("/v1/tasks/qds-0/stream", 3); strings.Join(types, " ") != "attempt_started token attempt_ended" {
		t.Fatalf("the deferral's stream: %v, want its attempt ended", types)
	}
}

// TestQueueOutcomeDeferLabel: drover_tasks_deferred_total labels an
// external worker's deferral "budget KEY" when it waits for the task's own
// budget, and "external" for any other reason: free text sent over HTTP
// makes no series of its own.
func TestQueueOutcomeDeferLabel(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const key = "openai/defer-label/key-a"
	tasks := qtasksJSON("qdl", 3)
	for _, tk := range tasks {
		tk["metadata"] = map[string]any{"budget": key, "estimated_tokens": 100}
	}
	a.do("POST", "/v1/queues/qdl/tasks", tasks).want(t, 200)
	sess := a.session(30)
	got := a.qclaim("qdl", sess, 3, "")
	if len(got) != 3 {
		t.Fatalf("claimed %v", got)
	}
	count := func(label string) float64 {
		return testutil.ToFloat64(metrics.TasksDeferred.WithLabelValues("qdl", "x", label))
	}
	const free = "waiting for 12 seconds more"
	own, ext, freeBefore := count("budget "+key), count("external"), count(free)
	d := func(reason string) map[string]any { return map[string]any{"after": "1h", "reason": reason} }
	wantResults(t, a.qreport("qdl", sess,
		qoutcome(got[0], "defer", d("budget "+key+": 5 requests of 5 used")),
		qoutcome(got[1], "defer", d(free)),
		qoutcome(got[2], "defer", d("budget another/key: no room"))), "200 PENDING", "200 PENDING", "200 PENDING")
	if n := count("budget "+key) - own; n != 1 {
		t.Errorf("label budget %s rose by %v, want 1", key, n)
	}
	if n := count("external") - ext; n != 2 {
		t.Errorf("label external rose by %v, want 2 (free text, another budget)", n)
	}
	if n := count(free) - freeBefore; n != 0 {
		t.Errorf("the free text made a series of its own (%v)", n)
	}
}

// TestSingleRoutesDefer: the single ack and fail routes take the batch
// route's defer: the task goes back PENDING without spending an attempt,
// its history records the reason, budget_wait names its budget and the
// budget's deferral metric counts it. Bad input is a 400 naming the
// field, with nothing written.
func TestSingleRoutesDefer(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const key = "openai/defer-single/key-a"
	tasks := qtasksJSON("qsd", 2)
	for _, tk := range tasks {
		tk["metadata"] = map[string]any{"budget": key, "estimated_tokens": 100}
	}
	a.do("POST", "/v1/queues/qsd/tasks", tasks).want(t, 200)
	sess := a.session(30)
	got := a.qclaim("qsd", sess, 2, "")
	if len(got) != 2 {
		t.Fatalf("claimed %v", got)
	}
	d := func(after, reason string) map[string]any { return map[string]any{"after": after, "reason": reason} }
	bad := []struct {
		name, route, field string
		body               map[string]any
	}{
		{"ack with result", "ack", "body.defer", qfence(sess, got[0], "result", 1, "defer", d("1s", "x"))},
		{"ack blank reason", "ack", "body.defer.reason", qfence(sess, got[0], "defer", d("1s", " "))},
		{"ack over a day", "ack", "body.defer.after", qfence(sess, got[0], "defer", d("25h", "x"))},
		{"ack no reason", "ack", "body.defer", qfence(sess, got[0], "defer", map[string]any{"after": "1s"})},
		{"fail with error", "fail", "body.defer", qfence(sess, got[0], "error", "e", "defer", d("1s", "x"))},
		{"fail permanent", "fail", "body.defer", qfence(sess, got[0], "permanent", true, "defer", d("1s", "x"))},
		{"fail negative", "fail", "body.defer.after", qfence(sess, got[0], "defer", d("-1s", "x"))},
		{"fail long reason", "fail", "body.defer.reason", qfence(sess, got[0], "defer", d("1s", strings.Repeat("x", 1025)))},
		{"fail neither", "fail", "body.error", qfence(sess, got[0])},
	}
	for _, c := range bad {
		before := a.keyCount()
		p := a.do("POST", "/v1/queues/qsd/tasks/"+got[0]["task_id"].(string)+"/"+c.route, c.body).problem(t, 400)
		if !strings.Contains(string(p.Raw), c.field) {
			t.Errorf("%s: %s, want it to name %s", c.name, p.Raw, c.field)
		}
		if after := a.keyCount(); after != before {
			t.Errorf("%s: keys %d → %d", c.name, before, after)
		}
	}
	counted := testutil.ToFloat64(metrics.BudgetTaskDeferrals.WithLabelValues(key))
	reason := "budget " + key + ": 5 requests of 5 used in this window"
	for i, route := range []string{"ack", "fail"} {
		id := got[i]["task_id"].(string)
		r := a.do("POST", "/v1/queues/qsd/tasks/"+id+"/"+route, qfence(sess, got[i], "defer", d("1h", reason))).want(t, 200)
		if r.str("current_status") != "PENDING" || r.num("attempt") != 0 {
			t.Fatalf("%s with defer: %s, want PENDING at attempt 0", route, r.Raw)
		}
		r = a.do("GET", "/v1/queues/qsd/tasks/"+id, nil).want(t, 200)
		bw, _ := r.JSON["budget_wait"].(map[string]any)
		if bw == nil || bw["budget"] != key || bw["reason"] != reason || r.num("attempt") != 0 || !strings.Contains(string(r.Raw), "deferred: "+reason) {
			t.Errorf("a task deferred by %s: %s, want budget_wait for %s, attempt 0, the reason in its history", route, r.Raw, key)
		}
		// The claim ended with the deferral: the same one again is a 409.
		a.do("POST", "/v1/queues/qsd/tasks/"+id+"/"+route, qfence(sess, got[i], "defer", d("1h", reason))).problem(t, 409)
	}
	if n := testutil.ToFloat64(metrics.BudgetTaskDeferrals.WithLabelValues(key)) - counted; n != 2 {
		t.Errorf("drover_budget_task_deferrals_total{budget=%q} rose by %v, want 2", key, n)
	}
}

// TestAckDeferWithNullResult: the single ack route takes defer beside
// "result": null, which is no result as in the batch route, and hands the
// task back; beside a result, defer is a 400 naming it, nothing written.
func TestAckDeferWithNullResult(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/qdn/tasks", qtasksJSON("qdn", 1)).want(t, 200)
	sess := a.session(30)
	tk := a.qclaim("qdn", sess, 1, "")[0]
	d := map[string]any{"after": "1h", "reason": "quota q full"}
	path := "/v1/queues/qdn/tasks/" + tk["task_id"].(string) + "/ack"
	before := a.keyCount()
	p := a.do("POST", path, map[string]any{"session": sess, "token": tk["token"], "defer": d, "result": map[string]any{"x": 1}}).problem(t, 400)
	if !strings.Contains(string(p.Raw), "body.defer") {
		t.Fatalf("defer beside a result: %s, want it to name body.defer", p.Raw)
	}
	if after := a.keyCount(); after != before {
		t.Fatalf("defer beside a result: keys %d → %d", before, after)
	}
	a.do("POST", path, map[string]any{"session": sess, "token": tk["token"], "defer": d, "result": nil}).want(t, 200)
	r := a.do("GET", "/v1/queues/qdn/tasks/"+tk["task_id"].(string), nil).want(t, 200)
	// Handed back for an hour: RETRYING until then, its attempt not counted.
	if r.str("current_status") != "RETRYING" || r.num("attempt") != 0 || !strings.Contains(string(r.Raw), "deferred: quota q full") {
		t.Fatalf("after defer with a null result: %s, want it handed back, attempt 0, with the deferral", r.Raw)
	}
}
