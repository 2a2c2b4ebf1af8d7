package httpapi_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/task"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// unb64 decodes a base64 field of a body.
func unb64(t *testing.T, r resp, k string) string {
	t.Helper()
	b, err := base64.StdEncoding.DecodeString(r.str(k))
	if err != nil {
		t.Fatalf("%s: %v (%s)", k, err, r.Raw)
	}
	return string(b)
}

// claim claims task id under session and returns the answer.
func (a *api) claim(id, session string, code int) resp {
	a.t.Helper()
	return a.do("POST", "/v1/agent-tasks/"+id+"/claim", map[string]any{"session": session}).want(a.t, code)
}

// step writes step n of task id.
func (a *api) step(id string, n int, session string, token float64, state string) resp {
	a.t.Helper()
	return a.do("PUT", fmt.Sprintf("/v1/agent-tasks/%s/steps/%d", id, n), map[string]any{"session": session, "token": token, "name": fmt.Sprintf("s%d", n), "state": b64(state)})
}

// TestAgentTaskLifecycle: claim, one holder at a time, step writes in
// order (a repeat is answered as before, a skip or a rewrite is a 409 that
// writes nothing), completion with a result that releases the claim, and a
// completed task is not claimed again.
func TestAgentTaskLifecycle(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(30), a.session(30)
	r := a.do("POST", "/v1/agent-tasks/report-1/claim", map[string]any{"session": s1, "steps": 3}).want(t, 200)
	tok := r.num("token")
	if tok <= 0 || r.num("step") != 0 || r.num("next_step") != 1 || r.JSON["completed"] != false || r.num("steps") != 3 {
		t.Fatalf("claim: %s", r.Raw)
	}
	if p := a.claim("report-1", s2, 409).problem(t, 409); p.JSON["holder"] == nil {
		t.Fatalf("a held task's 409 names no holder: %s", p.Raw)
	}
	g := a.do("GET", "/v1/agent-tasks/report-1", nil).want(t, 200)
	if c, _ := g.JSON["claim"].(map[string]any); c == nil || c["token"].(float64) != tok {
		t.Fatalf("GET shows no claim with the token: %s", g.Raw)
	}

	r = a.step("report-1", 1, s1, tok, "one").want(t, 200)
	if r.num("step") != 1 || r.num("next_step") != 2 || unb64(t, r, "state") != "one" || r.num("written_token") != tok {
		t.Fatalf("step 1: %s", r.Raw)
	}
	before := a.keyCount()
	a.step("report-1", 1, s1, tok, "one").want(t, 200) // a retry of the same write
	a.step("report-1", 1, s1, tok, "uno").problem(t, 409)
	a.step("report-1", 3, s1, tok, "three").problem(t, 409)
	a.step("report-1", 2, s2, tok, "two").problem(t, 409)   // not the claim's session
	a.step("report-1", 2, s1, tok+1, "two").problem(t, 409) // not its token
	if n := a.keyCount(); n != before {
		t.Fatalf("refused writes changed the keys: %d, then %d", before, n)
	}
	a.step("report-1", 2, s1, tok, "two").want(t, 200)

	r = a.do("POST", "/v1/agent-tasks/report-1/complete", map[string]any{"session": s1, "token": tok, "result": b64("done")}).want(t, 200)
	if r.JSON["completed"] != true || unb64(t, r, "state") != "done" || r.num("step") != 2 {
		t.Fatalf("complete: %s", r.Raw)
	}
	g = a.do("GET", "/v1/agent-tasks/report-1", nil).want(t, 200)
	hist, _ := g.JSON["history"].([]any)
	if g.JSON["claim"] != nil || len(hist) != 2 || g.JSON["completed"] != true {
		t.Fatalf("after completion (claim released, two steps): %s", g.Raw)
	}
	a.step("report-1", 3, s1, tok, "three").problem(t, 409)
	r = a.claim("report-1", s2, 200)
	if r.JSON["completed"] != true || r.num("token") != 0 || unb64(t, r, "state") != "done" {
		t.Fatalf("claim of a completed task: %s", r.Raw)
	}
	a.do("GET", "/v1/agent-tasks/report-1", nil).want(t, 200)
	if g := a.do("GET", "/v1/agent-tasks/report-1", nil); g.JSON["claim"] != nil {
		t.Fatalf("a completed task's claim is held: %s", g.Raw)
	}
	a.do("GET", "/v1/agent-tasks/never-seen", nil).problem(t, 404)
}

// TestAgentTaskLastStepCompletes: with the step count known, writing the
// last step completes the task and releases the claim, as a Go runner does.
func TestAgentTaskLastStepCompletes(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("two-steps", s, 200).num("token")
	for n := 1; n <= 2; n++ {
		r := a.do("PUT", fmt.Sprintf("/v1/agent-tasks/two-steps/steps/%d", n), map[string]any{"session": s, "token": tok, "steps": 2, "state": b64("x")}).want(t, 200)
		if want := n == 2; r.JSON["completed"] != want {
			t.Fatalf("step %d: completed %v, want %v: %s", n, r.JSON["completed"], want, r.Raw)
		}
	}
	if g := a.do("GET", "/v1/agent-tasks/two-steps", nil).want(t, 200); g.JSON["claim"] != nil || g.str("step_name") != "step 2" {
		t.Fatalf("after the last step: %s", g.Raw)
	}
}

// TestAgentTaskSessionExpiredIsFenced: a step write after the claim's
// session expired is a 409 that writes nothing, and another session claims
// the task and resumes after the last written step.
func TestAgentTaskSessionExpiredIsFenced(t *testing.T) {
	a := newAPI(t)
	s1 := a.session(2)
	tok := a.claim("crawl", s1, 200).num("token")
	a.step("crawl", 1, s1, tok, "page-1").want(t, 200)
	start := time.Now()
	for a.do("GET", "/v1/sessions/"+s1, nil).Status == 200 {
		if time.Since(start) > 6*time.Second {
			t.Fatal("session alive 6 s after its 2 s TTL")
		}
		time.Sleep(100 * time.Millisecond)
	}
	before := a.keyCount()
	p := a.step("crawl", 2, s1, tok, "page-2").problem(t, 409)
	if !strings.Contains(p.str("type"), "fenced") {
		t.Fatalf("a write under a lost claim: %s", p.Raw)
	}
	a.do("POST", "/v1/agent-tasks/crawl/complete", map[string]any{"session": s1, "token": tok}).problem(t, 409)
	if n := a.keyCount(); n != before {
		t.Fatalf("a fenced write changed the keys: %d, then %d", before, n)
	}

	s2 := a.session(30)
	r := a.claim("crawl", s2, 200)
	tok2 := r.num("token")
	if tok2 <= tok || r.num("step") != 1 || r.num("next_step") != 2 || unb64(t, r, "state") != "page-1" {
		t.Fatalf("takeover (resume at step 2 with page-1, a higher token than %v): %s", tok, r.Raw)
	}
	a.step("crawl", 2, s2, tok, "stale").problem(t, 409) // the old token under the new session
	a.step("crawl", 2, s2, tok2, "page-2").want(t, 200)
	g := a.do("GET", "/v1/agent-tasks/crawl", nil).want(t, 200)
	hist, _ := g.JSON["history"].([]any)
	if len(hist) != 2 || hist[0].(map[string]any)["token"].(float64) != tok || hist[1].(map[string]any)["token"].(float64) != tok2 {
		t.Fatalf("history (step 1 under %v, step 2 under %v): %s", tok, tok2, g.Raw)
	}
}

// TestAgentTaskSharedWithGoRunner: an HTTP claim and a Go runner exclude
// each other (one claim path), and the runner resumes after the step an
// HTTP client wrote.
func TestAgentTaskSharedWithGoRunner(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.do("POST", "/v1/agent-tasks/mixed/claim", map[string]any{"session": s, "steps": 2}).want(t, 200).num("token")
	r, err := task.NewRunner(context.Background(), a.cli, task.RunnerConfig{Namespace: a.ns, WorkerID: "go-worker", TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	var ran []string
	steps := []task.Step{
		{Name: "one", Run: func(context.Context, []byte) ([]byte, error) { ran = append(ran, "one"); return []byte("go-1"), nil }},
		{Name: "two", Run: func(_ context.Context, in []byte) ([]byte, error) {
			ran = append(ran, "two:"+string(in))
			return []byte("go-2"), nil
		}},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
	_, err = r.Run(ctx, "mixed", steps)
	cancel()
	if err == nil || len(ran) != 0 {
		t.Fatalf("the Go runner ran a task an HTTP client holds: err %v, ran %v", err, ran)
	}
	a.do("PUT", "/v1/agent-tasks/mixed/steps/1", map[string]any{"session": s, "token": tok, "name": "one", "steps": 2, "state": b64("http-1")}).want(t, 200)
	a.do("DELETE", fmt.Sprintf("/v1/agent-tasks/mixed/claim?session=%s&token=%d", s, int64(tok)), nil).want(t, 204)
	a.do("DELETE", fmt.Sprintf("/v1/agent-tasks/mixed/claim?session=%s&token=%d", s, int64(tok)), nil).problem(t, 409)
	res, err := r.Run(context.Background(), "mixed", steps)
	if err != nil || res.ResumedFrom != 2 || len(ran) != 1 || ran[0] != "two:http-1" {
		t.Fatalf("the runner after an HTTP step: %+v, %v, ran %v", res, err, ran)
	}
	if g := a.do("GET", "/v1/agent-tasks/mixed", nil).want(t, 200); g.JSON["completed"] != true || unb64(t, g, "state") != "go-2" {
		t.Fatalf("after the runner: %s", g.Raw)
	}
}

// TestAgentTaskWaitInLine: ?wait queues the claim until the holder
// releases it.
func TestAgentTaskWaitInLine(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(30), a.session(30)
	tok := a.claim("queued", s1, 200).num("token")
	go func() {
		time.Sleep(300 * time.Millisecond)
		a.send("DELETE", fmt.Sprintf("/v1/agent-tasks/queued/claim?session=%s&token=%d", s1, int64(tok)))
	}()
	r := a.do("POST", "/v1/agent-tasks/queued/claim?wait=5s", map[string]any{"session": s2}).want(t, 200)
	if r.num("token") <= tok {
		t.Fatalf("the waiter's claim: %s", r.Raw)
	}
	a.do("POST", "/v1/agent-tasks/queued/claim?wait=200ms", map[string]any{"session": s1}).problem(t, 409)
}

// TestAgentTaskStoreFull: past the high-water mark a step write and a
// completion are 507 and write nothing; the claim itself still works.
func TestAgentTaskStoreFull(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("full", s, 200).num("token")
	keys := keyspace.MustNew(a.ns)
	if err := storeguard.Set(context.Background(), a.cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	before := a.keyCount()
	a.step("full", 1, s, tok, "x").problem(t, 507)
	a.do("POST", "/v1/agent-tasks/full/complete", map[string]any{"session": s, "token": tok}).problem(t, 507)
	if n := a.keyCount(); n != before {
		t.Fatalf("writes past the high-water mark changed the keys: %d, then %d", before, n)
	}
	if err := storeguard.Clear(context.Background(), a.cli, keys); err != nil {
		t.Fatal(err)
	}
	a.step("full", 1, s, tok, "x").want(t, 200)
}

// TestAgentTaskBadInput: malformed JSON, wrong types, unknown fields,
// invalid ids and sessions, out-of-range numbers and oversized bodies are
// 400 or 413 problems on every route, and write nothing.
func TestAgentTaskBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("ok-task", s, 200).num("token")
	big := strings.Repeat("A", 2<<20) // base64 of 1.5 MiB: over every route's limit
	stateOver := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, task.DefaultStateLimit+1))
	okStep := func(extra string) string {
		return fmt.Sprintf(`{"session":%q,"token":%d,"state":"eA=="%s}`, s, int64(tok), extra)
	}
	cases := []struct {
		method, path string
		body         any
		code         int
	}{
		{"POST", "/v1/agent-tasks/x/claim", `{"session":`, 400},
		{"POST", "/v1/agent-tasks/x/claim", `{"session": 5}`, 400},
		{"POST", "/v1/agent-tasks/x/claim", fmt.Sprintf(`{"session":%q,"color":"red"}`, s), 400},
		{"POST", "/v1/agent-tasks/x/claim", fmt.Sprintf(`{"session":%q,"steps":-1}`, s), 400},
		{"POST", "/v1/agent-tasks/x/claim", `{}`, 400},
		{"POST", "/v1/agent-tasks/x/claim", `{"session":"not-hex"}`, 400},
		{"POST", "/v1/agent-tasks/bad*id/claim", fmt.Sprintf(`{"session":%q}`, s), 400},
		{"POST", "/v1/agent-tasks/" + strings.Repeat("x", 121) + "/claim", fmt.Sprintf(`{"session":%q}`, s), 400},
		{"POST", "/v1/agent-tasks/x/claim?wait=soon", fmt.Sprintf(`{"session":%q}`, s), 400},
		{"POST", "/v1/agent-tasks/x/claim", fmt.Sprintf(`{"session":%q,"pad":%q}`, s, big), 413},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", okStep("")[:20], 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", fmt.Sprintf(`{"session":%q,"token":"7","state":"eA=="}`, s), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", okStep(`,"extra":1`), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", fmt.Sprintf(`{"session":%q,"token":%d,"state":"***"}`, s, int64(tok)), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", fmt.Sprintf(`{"session":%q,"token":0,"state":"eA=="}`, s), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/0", okStep(""), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/one", okStep(""), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/3", okStep(`,"steps":2`), 400},
		{"PUT", "/v1/agent-tasks/bad*id/steps/1", okStep(""), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", fmt.Sprintf(`{"session":"zz","token":%d,"state":"eA=="}`, int64(tok)), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", fmt.Sprintf(`{"session":%q,"token":%d,"state":%q}`, s, int64(tok), stateOver), 400},
		{"PUT", "/v1/agent-tasks/ok-task/steps/1", fmt.Sprintf(`{"session":%q,"token":%d,"state":%q}`, s, int64(tok), big), 413},
		{"POST", "/v1/agent-tasks/ok-task/complete", `[1,2]`, 400},
		{"POST", "/v1/agent-tasks/ok-task/complete", fmt.Sprintf(`{"session":%q,"token":%d,"result":"***"}`, s, int64(tok)), 400},
		{"POST", "/v1/agent-tasks/ok-task/complete", fmt.Sprintf(`{"session":%q,"token":%d,"why":"x"}`, s, int64(tok)), 400},
		{"POST", "/v1/agent-tasks/ok-task/complete", fmt.Sprintf(`{"session":%q,"token":%d,"result":%q}`, s, int64(tok), stateOver), 400},
		{"POST", "/v1/agent-tasks/ok-task/complete", fmt.Sprintf(`{"session":%q,"token":%d,"result":%q}`, s, int64(tok), big), 413},
		{"POST", "/v1/agent-tasks/bad*id/complete", fmt.Sprintf(`{"session":%q,"token":%d}`, s, int64(tok)), 400},
		{"DELETE", "/v1/agent-tasks/ok-task/claim?session=" + s, nil, 400},
		{"DELETE", fmt.Sprintf("/v1/agent-tasks/ok-task/claim?session=%s&token=abc", s), nil, 400},
		{"DELETE", fmt.Sprintf("/v1/agent-tasks/ok-task/claim?session=nothex&token=%d", int64(tok)), nil, 400},
		{"DELETE", fmt.Sprintf("/v1/agent-tasks/bad*id/claim?session=%s&token=%d", s, int64(tok)), nil, 400},
		{"GET", "/v1/agent-tasks/bad*id", nil, 400},
	}
	before := a.keyNames()
	for _, c := range cases {
		r := a.do(c.method, c.path, c.body)
		if r.Status != c.code {
			t.Errorf("%s %s %.80v: %d, want %d: %.300s", c.method, c.path, c.body, r.Status, c.code, r.Raw)
			continue
		}
		r.problem(t, c.code)
		if d := a.keysChanged(before); d != "" {
			t.Fatalf("%s %s %.80v changed the keys: %s", c.method, c.path, c.body, d)
		}
	}
	if g := a.do("GET", "/v1/agent-tasks/ok-task", nil).want(t, 200); g.num("step") != 0 {
		t.Fatalf("bad input wrote a step: %s", g.Raw)
	}
}

// send sends a bodiless request from any goroutine, ignoring the answer.
func (a *api) send(method, path string) {
	req, err := http.NewRequest(method, a.base+path, nil)
	if err != nil {
		return
	}
	req.Header.Set(httpapi.NamespaceHeader, a.ns)
	if r, err := a.hc.Do(req); err == nil {
		r.Body.Close()
	}
}

// TestAgentTaskHeldByQueueWorker: a task id a queue worker has claimed
// cannot be claimed as an agent task (409, at once and after a wait), and
// can once the queue's claim has ended.
func TestAgentTaskHeldByQueueWorker(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s1, s2 := a.session(30), a.session(30)
	a.do("POST", "/v1/queues/jobs/tasks", []map[string]any{{"task_id": "qjob", "task_type": "x"}}).want(t, 200)
	c := a.do("POST", "/v1/queues/jobs/claim", map[string]any{"session": s1, "max": 1}).want(t, 200)
	tasks, _ := c.JSON["tasks"].([]any)
	if len(tasks) != 1 {
		t.Fatalf("queue claim: %s", c.Raw)
	}
	before := a.keyCount()
	a.do("POST", "/v1/agent-tasks/qjob/claim", map[string]any{"session": s2}).problem(t, 409)
	a.do("POST", "/v1/agent-tasks/qjob/claim?wait=200ms", map[string]any{"session": s2}).problem(t, 409)
	if n := a.keyCount(); n != before {
		t.Fatalf("%d keys before refused claims, %d after", before, n)
	}
	tok := tasks[0].(map[string]any)["token"]
	a.do("POST", "/v1/queues/jobs/tasks/qjob/ack", map[string]any{"session": s1, "token": tok}).want(t, 200)
	a.do("POST", "/v1/agent-tasks/qjob/claim", map[string]any{"session": s2}).want(t, 200)
}

// TestAgentTaskCompleteWithJSONResult: complete takes any JSON value as the
// result, as a queue ack does, and answers it back as result; a string is
// still base64 of the result's bytes, as clients have sent it.
func TestAgentTaskCompleteWithJSONResult(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("json-result", s, 200).num("token")
	body := fmt.Sprintf(`{"session":%q,"token":%d,"result":{"summary":"ok","pages":3}}`, s, int64(tok))
	r := a.do("POST", "/v1/agent-tasks/json-result/complete", body).want(t, 200)
	want := `{"summary":"ok","pages":3}`
	if got, _ := json.Marshal(r.JSON["result"]); string(got) != `{"pages":3,"summary":"ok"}` || unb64(t, r, "state") != want {
		t.Fatalf("complete with a JSON result: %s", r.Raw)
	}
	g := a.do("GET", "/v1/agent-tasks/json-result", nil).want(t, 200)
	if res, _ := g.JSON["result"].(map[string]any); res["summary"] != "ok" || g.JSON["completed"] != true {
		t.Fatalf("GET after a JSON result: %s", g.Raw)
	}
	if c := a.claim("json-result", s, 200); c.JSON["completed"] != true || c.JSON["result"].(map[string]any)["pages"] != 3.0 {
		t.Fatalf("claim of the completed task: %s", c.Raw)
	}

	tok = a.claim("b64-result", s, 200).num("token")
	r = a.do("POST", "/v1/agent-tasks/b64-result/complete", map[string]any{"session": s, "token": tok, "result": b64("done")}).want(t, 200)
	if unb64(t, r, "state") != "done" || r.JSON["result"] != nil {
		t.Fatalf("complete with a base64 result (not JSON text): %s", r.Raw)
	}
	tok = a.claim("number-result", s, 200).num("token")
	r = a.do("POST", "/v1/agent-tasks/number-result/complete", map[string]any{"session": s, "token": tok, "result": 7}).want(t, 200)
	if unb64(t, r, "state") != "7" || r.num("result") != 7 {
		t.Fatalf("complete with a number: %s", r.Raw)
	}
}

// TestAgentTaskClaimKeepsSteps: the step count a claim names is kept, so
// step writes that leave it out still count toward it: the task reads as
// at step 2 of 3, and writing step 3 completes it.
func TestAgentTaskClaimKeepsSteps(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	r := a.do("POST", "/v1/agent-tasks/counted/claim", map[string]any{"session": s, "steps": 3}).want(t, 200)
	tok := r.num("token")
	if r.num("steps") != 3 || r.num("next_step") != 1 {
		t.Fatalf("claim: %s", r.Raw)
	}
	a.step("counted", 1, s, tok, "one").want(t, 200)
	if r = a.step("counted", 2, s, tok, "two").want(t, 200); r.num("steps") != 3 {
		t.Fatalf("step 2 written without steps: %s", r.Raw)
	}
	if g := a.do("GET", "/v1/agent-tasks/counted", nil).want(t, 200); g.num("steps") != 3 || g.num("step") != 2 {
		t.Fatalf("read at step 2: %s", g.Raw)
	}
	if r = a.step("counted", 3, s, tok, "three").want(t, 200); r.JSON["completed"] != true {
		t.Fatalf("the claim's last step did not complete the task: %s", r.Raw)
	}
}
