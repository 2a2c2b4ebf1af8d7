package httpapi_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
)

// qoutcome is one outcome of a batch for task tk (its token), with extra
// fields.
func qoutcome(tk map[string]any, extra ...any) map[string]any {
	o := map[string]any{"task_id": tk["task_id"], "token": tk["token"]}
	for i := 0; i+1 < len(extra); i += 2 {
		o[extra[i].(string)] = extra[i+1]
	}
	return o
}

// qreport sends a batch of outcomes to q and returns the results.
func (a *api) qreport(q, sess string, outcomes ...map[string]any) []map[string]any {
	a.t.Helper()
	r := a.do("POST", "/v1/queues/"+q+"/outcomes", map[string]any{"session": sess, "outcomes": outcomes}).want(a.t, 200)
	var out []map[string]any
	for _, x := range r.JSON["results"].([]any) {
		out = append(out, x.(map[string]any))
	}
	if len(out) != len(outcomes) {
		a.t.Fatalf("%d results for %d outcomes: %s", len(out), len(outcomes), r.Raw)
	}
	return out
}

// wantResults checks each result's status (and task state, for a 200).
func wantResults(t *testing.T, got []map[string]any, want ...string) {
	t.Helper()
	for i, w := range want {
		status, state, _ := strings.Cut(w, " ")
		if s := fmt.Sprint(got[i]["status"]); s != status || state != "" && got[i]["current_status"] != state {
			t.Errorf("result %d: %v, want %s", i, got[i], w)
		}
	}
}

// TestQueueOutcomesBatch: one request reports the outcomes of two claims:
// acks (with and without a result), a transient and a permanent failure;
// an outcome naming the wrong token is a 409 of its own and writes
// nothing (the task stays RUNNING, its true claim acks later); an unknown
// task is a 404; the same task and token twice count once.
func TestQueueOutcomesBatch(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/ob/tasks", qtasksJSON("ob", 8)).want(t, 200)
	sess := a.session(10)
	one := a.qclaim("ob", sess, 1, "")
	many := a.qclaim("ob", sess, 6, "")
	if len(one) != 1 || len(many) != 6 || one[0]["token"] == many[0]["token"] {
		t.Fatalf("claimed %v and %v", one, many)
	}
	stale := map[string]any{"task_id": one[0]["task_id"], "token": many[0]["token"]}
	got := a.qreport("ob", sess,
		qoutcome(many[0], "result", map[string]any{"n": 1}),
		qoutcome(stale, "result", "nope"),
		qoutcome(many[1], "error", "flaky"),
		qoutcome(many[2], "error", "broken", "permanent", true),
		map[string]any{"task_id": "nope", "token": 5},
		qoutcome(many[3], "ok", true),
		qoutcome(many[0], "error", "twice"),
	)
	wantResults(t, got, "200 SUCCEEDED", "409", "200 RETRYING", "200 DEAD", "404", "200 SUCCEEDED", "409")
	if got[2]["scheduled_at"] == nil || got[0]["attempt"].(float64) != 1 {
		t.Errorf("results %v", got)
	}
	if r := a.do("GET", "/v1/queues/ob/tasks/"+many[0]["task_id"].(string), nil).want(t, 200); r.str("current_status") != "SUCCEEDED" || !strings.Contains(string(r.Raw), `"n":1`) {
		t.Fatalf("the first report of %s did not count: %s", many[0]["task_id"], r.Raw)
	}
	if r := a.do("GET", "/v1/queues/ob/tasks/"+one[0]["task_id"].(string), nil).want(t, 200); r.str("current_status") != "RUNNING" {
		t.Fatalf("a stale outcome was written: %s", r.Raw)
	}
	// The rest of the claims: the run's last outcomes, and the other claim.
	wantResults(t, a.qreport("ob", sess, qoutcome(many[4]), qoutcome(one[0], "result", "yes"), qoutcome(many[5])), "200 SUCCEEDED", "200 SUCCEEDED", "200 SUCCEEDED")
	wantResults(t, a.qreport("ob", sess, qoutcome(many[4])), "409")
	a.do("POST", qtaskPath("ob", many[5], "ack"), qfence(sess, many[5])).problem(t, 409)
	st := a.do("GET", "/v1/queues/ob/stats", nil).want(t, 200)
	if st.num("succeeded") != 5 || st.num("retrying") != 1 || st.num("dead") != 1 || st.num("running") != 0 || st.num("pending") != 1 {
		t.Fatalf("stats %s", st.Raw)
	}
}

// TestQueueOutcomesBadInput: an outcome that breaks a rule anywhere in the
// batch is a 400 naming it, and nothing of the batch is written.
func TestQueueOutcomesBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/obad/tasks", qtasksJSON("obad", 2)).want(t, 200)
	sess := a.session(10)
	tk := a.qclaim("obad", sess, 2, "")
	good := qoutcome(tk[0])
	many := make([]map[string]any, 257)
	for i := range many {
		many[i] = good
	}
	cases := []struct {
		name string
		body any
	}{
		{"no outcomes", map[string]any{"session": sess, "outcomes": []any{}}},
		{"too many", map[string]any{"session": sess, "outcomes": many}},
		{"no session", map[string]any{"outcomes": []any{good}}},
		{"bad session", map[string]any{"session": "zz", "outcomes": []any{good}}},
		{"zero token", map[string]any{"session": sess, "outcomes": []any{good, map[string]any{"task_id": tk[1]["task_id"], "token": 0}}}},
		{"no task id", map[string]any{"session": sess, "outcomes": []any{good, map[string]any{"token": 3}}}},
		{"bad task id", map[string]any{"session": sess, "outcomes": []any{good, map[string]any{"task_id": "a b", "token": 3}}}},
		{"ok false without error", map[string]any{"session": sess, "outcomes": []any{good, qoutcome(tk[1], "ok", false)}}},
		{"ok with error", map[string]any{"session": sess, "outcomes": []any{good, qoutcome(tk[1], "ok", true, "error", "e")}}},
		{"result with error", map[string]any{"session": sess, "outcomes": []any{good, qoutcome(tk[1], "error", "e", "result", 1)}}},
		{"unknown field", map[string]any{"session": sess, "outcomes": []any{good, qoutcome(tk[1], "retry", true)}}},
		{"wrong type", map[string]any{"session": sess, "outcomes": []any{good, qoutcome(tk[1], "permanent", "yes")}}},
		{"malformed", `{"session":"` + sess + `","outcomes":[{"task_id":`},
	}
	for _, c := range cases {
		before := a.keyCount()
		r := a.do("POST", "/v1/queues/obad/outcomes", c.body)
		if r.Status != 400 {
			t.Errorf("%s: status %d, want 400: %s", c.name, r.Status, r.Raw)
			continue
		}
		r.problem(t, 400)
		if after := a.keyCount(); after != before {
			t.Errorf("%s: keys %d → %d", c.name, before, after)
		}
	}
	a.do("POST", "/v1/queues/a%20b/outcomes", map[string]any{"session": sess, "outcomes": []any{good}}).problem(t, 400)
	// Nothing was written: both claims still hold.
	wantResults(t, a.qreport("obad", sess, qoutcome(tk[0]), qoutcome(tk[1], "error", "e", "permanent", true)), "200 SUCCEEDED", "200 DEAD")
}

// TestQueueOutcomesConcurrent: sessions claim and report in batches, each
// batch sent twice at once: every task is recorded exactly once (one 200
// across all answers), and the queue ends with every task SUCCEEDED.
func TestQueueOutcomesConcurrent(t *testing.T) {
	t.Parallel()
	const n = 60
	a := newAPI(t)
	a.do("POST", "/v1/queues/oc/tasks", qtasksJSON("oc", n)).want(t, 200)
	var mu sync.Mutex
	claimed, recorded := map[string]int{}, map[string]int{}
	var wg sync.WaitGroup
	for range 5 {
		sess := a.session(10)
		wg.Go(func() {
			for {
				got := a.qclaim("oc", sess, 4, "")
				if len(got) == 0 {
					return
				}
				var batch []map[string]any
				for _, tk := range got {
					batch = append(batch, qoutcome(tk))
				}
				var twice sync.WaitGroup
				for range 2 {
					twice.Go(func() {
						for i, r := range a.qreport("oc", sess, batch...) {
							mu.Lock()
							if r["status"].(float64) == 200 {
								recorded[got[i]["task_id"].(string)]++
							} else if r["status"].(float64) != 409 {
								t.Errorf("result %v", r)
							}
							mu.Unlock()
						}
					})
				}
				twice.Wait()
				mu.Lock()
				for _, tk := range got {
					claimed[tk["task_id"].(string)]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(claimed) != n || len(recorded) != n {
		t.Fatalf("claimed %d, recorded %d distinct tasks, want %d", len(claimed), len(recorded), n)
	}
	for id := range claimed {
		if claimed[id] != 1 || recorded[id] != 1 {
			t.Fatalf("%s claimed %d times, recorded %d times", id, claimed[id], recorded[id])
		}
	}
	if st := a.do("GET", "/v1/queues/oc/stats", nil).want(t, 200); st.num("succeeded") != n || st.num("pending")+st.num("running") != 0 {
		t.Fatalf("stats %s", st.Raw)
	}
}

// TestQueueOutcomesWithClaim: a batch of outcomes that carries a claim
// writes the outcomes, then claims for the same session, answering the
// tasks in the same response (fenced as any claim: their outcomes go in
// the next batch); with nothing left to claim, tasks is absent; a bad
// claim (wait or max) is a 400 naming the field, and nothing is written.
func TestQueueOutcomesWithClaim(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/oc/tasks", qtasksJSON("oc", 5)).want(t, 200)
	sess := a.session(10)
	first := a.qclaim("oc", sess, 2, "")
	before := a.keyCount()
	for _, bad := range []map[string]any{{"max": 2, "wait": "soon"}, {"max": 101}} {
		r := a.do("POST", "/v1/queues/oc/outcomes", map[string]any{"session": sess, "outcomes": []map[string]any{qoutcome(first[0])}, "claim": bad}).want(t, 400)
		if !strings.Contains(string(r.Raw), "claim.") {
			t.Fatalf("bad claim %v: %s", bad, r.Raw)
		}
	}
	if n := a.keyCount(); n != before {
		t.Fatalf("a refused request changed the keys: %d, then %d", before, n)
	}
	r := a.do("POST", "/v1/queues/oc/outcomes", map[string]any{"session": sess, "outcomes": []map[string]any{qoutcome(first[0]), qoutcome(first[1])},
		"claim": map[string]any{"max": 2}}).want(t, 200)
	next, _ := r.JSON["tasks"].([]any)
	if len(next) != 2 {
		t.Fatalf("the batch's claim: %s", r.Raw)
	}
	var outs []map[string]any
	for _, tk := range next {
		outs = append(outs, qoutcome(tk.(map[string]any)))
	}
	r = a.do("POST", "/v1/queues/oc/outcomes", map[string]any{"session": sess, "outcomes": outs, "claim": map[string]any{"max": 5}}).want(t, 200)
	last, _ := r.JSON["tasks"].([]any)
	if len(last) != 1 {
		t.Fatalf("the second batch's claim: %s", r.Raw)
	}
	r = a.do("POST", "/v1/queues/oc/outcomes", map[string]any{"session": sess, "outcomes": []map[string]any{qoutcome(last[0].(map[string]any))}, "claim": map[string]any{"max": 5}}).want(t, 200)
	if _, ok := r.JSON["tasks"]; ok {
		t.Fatalf("a claim that found nothing answered tasks: %s", r.Raw)
	}
	st := a.do("GET", "/v1/queues/oc/stats", nil).want(t, 200)
	if fmt.Sprint(st.JSON["succeeded"]) != "5" {
		t.Fatalf("stats: %s", st.Raw)
	}
}

// TestQueueAckAnswersTransitions: an ack's and a fail's answers are the
// task as the outcome left it: its transitions run from PENDING through
// RUNNING to the state entered, as a read of the task shows them, and an
// ack's answer has the result.
func TestQueueAckAnswersTransitions(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/tr/tasks", qtasksJSON("tr", 2)).want(t, 200)
	sess := a.session(30)
	got := a.qclaim("tr", sess, 2, "5s")
	for len(got) < 2 { // the tasks may be in two segments: a claim takes one
		more := a.qclaim("tr", sess, 2, "5s")
		if len(more) == 0 {
			t.Fatal("the second task was not claimed")
		}
		got = append(got, more...)
	}
	statuses := func(r resp) string {
		var s []string
		trs, _ := r.JSON["transitions"].([]any)
		for _, tr := range trs {
			s = append(s, tr.(map[string]any)["status"].(string))
		}
		return strings.Join(s, ",")
	}
	ack := a.do("POST", qtaskPath("tr", got[0], "ack"), qfence(sess, got[0], "result", map[string]any{"n": 1})).want(t, 200)
	if s := statuses(ack); s != "PENDING,RUNNING,SUCCEEDED" || ack.JSON["result"] == nil {
		t.Fatalf("ack's answer: transitions %s: %s", s, ack.Raw)
	}
	g := a.do("GET", qtaskPath("tr", got[0], "")[:len(qtaskPath("tr", got[0], ""))-1], nil).want(t, 200)
	if gt, at := fmt.Sprint(g.JSON["transitions"]), fmt.Sprint(ack.JSON["transitions"]); gt != at {
		t.Fatalf("read after the ack: transitions %s, the ack answered %s", gt, at)
	}
	fail := a.do("POST", qtaskPath("tr", got[1], "fail"), qfence(sess, got[1], "error", "flaky")).want(t, 200)
	if s := statuses(fail); s != "PENDING,RUNNING,RETRYING" {
		t.Fatalf("fail's answer: transitions %s: %s", s, fail.Raw)
	}
}
