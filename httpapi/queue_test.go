package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
)

// tasksJSON is a JSON array of n tasks with ids prefix-0 ... prefix-(n-1).
func qtasksJSON(prefix string, n int) []map[string]any {
	out := make([]map[string]any, n)
	for i := range out {
		out[i] = map[string]any{"task_id": fmt.Sprintf("%s-%d", prefix, i), "task_type": "x", "parameters": map[string]any{"i": i}}
	}
	return out
}

// claim claims up to max tasks of q for session sess, waiting up to wait.
func (a *api) qclaim(q, sess string, max int, wait string) []map[string]any {
	a.t.Helper()
	r := a.do("POST", "/v1/queues/"+q+"/claim", map[string]any{"session": sess, "max": max, "wait": wait}).want(a.t, 200)
	var out []map[string]any
	for _, t := range r.JSON["tasks"].([]any) {
		out = append(out, t.(map[string]any))
	}
	return out
}

func qfence(sess string, task map[string]any, extra ...any) map[string]any {
	b := map[string]any{"session": sess, "token": task["token"]}
	for i := 0; i+1 < len(extra); i += 2 {
		b[extra[i].(string)] = extra[i+1]
	}
	return b
}

func qtaskPath(q string, task map[string]any, verb string) string {
	return fmt.Sprintf("/v1/queues/%s/tasks/%s/%s", q, task["task_id"], verb)
}

// TestQueueTaskLifecycle: tasks submitted as a JSON array are claimed with
// attempt and token, heartbeated, acked with a result, failed transiently
// (RETRYING) and permanently (DEAD, in the DLQ); a second outcome is 409;
// get, list, stats and the DLQ's routes show each; a dead task is requeued
// and claimed again; a pending one is cancelled.
func TestQueueTaskLifecycle(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.do("POST", "/v1/queues/q1/tasks", qtasksJSON("t", 4)).want(t, 200)
	if r.num("submitted") != 4 || r.num("duplicates") != 0 {
		t.Fatalf("submit: %s", r.Raw)
	}
	if r = a.do("POST", "/v1/queues/q1/tasks", qtasksJSON("t", 4)).want(t, 200); r.num("duplicates") != 4 {
		t.Fatalf("submit again: %s", r.Raw)
	}
	sess := a.session(10)
	got := a.qclaim("q1", sess, 3, "")
	if len(got) != 3 {
		t.Fatalf("claimed %d", len(got))
	}
	for _, tk := range got {
		if tk["current_status"] != "RUNNING" || tk["attempt"].(float64) != 1 || tk["token"].(float64) <= 0 {
			t.Fatalf("claimed %v", tk)
		}
		hb := a.do("POST", qtaskPath("q1", tk, "heartbeat"), qfence(sess, tk)).want(t, 200)
		if hb.num("token") != tk["token"].(float64) || hb.str("expires_at") == "" {
			t.Fatalf("heartbeat: %s", hb.Raw)
		}
	}
	ok := a.do("POST", qtaskPath("q1", got[0], "ack"), qfence(sess, got[0], "result", map[string]any{"words": 3})).want(t, 200)
	if ok.str("current_status") != "SUCCEEDED" {
		t.Fatalf("ack: %s", ok.Raw)
	}
	if r := a.do("POST", qtaskPath("q1", got[1], "fail"), qfence(sess, got[1], "error", "flaky")).want(t, 200); r.str("current_status") != "RETRYING" {
		t.Fatalf("transient fail: %s", r.Raw)
	}
	if r := a.do("POST", qtaskPath("q1", got[2], "fail"), qfence(sess, got[2], "error", "bad input", "permanent", true)).want(t, 200); r.str("current_status") != "DEAD" {
		t.Fatalf("permanent fail: %s", r.Raw)
	}
	for _, tk := range got {
		a.do("POST", qtaskPath("q1", tk, "ack"), qfence(sess, tk)).problem(t, 409)
		a.do("POST", qtaskPath("q1", tk, "heartbeat"), qfence(sess, tk)).problem(t, 409)
	}
	r = a.do("GET", fmt.Sprintf("/v1/queues/q1/tasks/%s", got[0]["task_id"]), nil).want(t, 200)
	if r.str("current_status") != "SUCCEEDED" || r.JSON["result"].(map[string]any)["words"] != 3.0 {
		t.Fatalf("get: %s", r.Raw)
	}
	a.do("GET", fmt.Sprintf("/v1/queues/other/tasks/%s", got[0]["task_id"]), nil).problem(t, 404)
	a.do("GET", "/v1/queues/q1/tasks/nope", nil).problem(t, 404)
	st := a.do("GET", "/v1/queues/q1/stats", nil).want(t, 200)
	if st.num("pending") != 1 || st.num("succeeded") != 1 || st.num("retrying") != 1 || st.num("dead") != 1 || st.num("running") != 0 {
		t.Fatalf("stats: %s", st.Raw)
	}
	for status, n := range map[string]int{"PENDING": 1, "SUCCEEDED": 1, "RETRYING": 1, "DEAD": 1, "RUNNING": 0} {
		r := a.do("GET", "/v1/queues/q1/tasks?status="+status, nil).want(t, 200)
		if l := len(r.JSON["tasks"].([]any)); l != n {
			t.Fatalf("%s: %d tasks, want %d: %s", status, l, n, r.Raw)
		}
	}
	dead := got[2]["task_id"].(string)
	if r := a.do("GET", "/v1/queues/q1/dlq", nil).want(t, 200); len(r.JSON["tasks"].([]any)) != 1 {
		t.Fatalf("dlq: %s", r.Raw)
	}
	if r := a.do("GET", "/v1/queues/q1/dlq/"+dead, nil).want(t, 200); r.str("last_error") != "bad input" {
		t.Fatalf("dlq show: %s", r.Raw)
	}
	a.do("GET", fmt.Sprintf("/v1/queues/q1/dlq/%s", got[0]["task_id"]), nil).problem(t, 404)
	if r := a.do("POST", "/v1/queues/q1/dlq/"+dead+"/requeue", nil).want(t, 200); r.num("count") != 1 {
		t.Fatalf("requeue: %s", r.Raw)
	}
	a.do("POST", "/v1/queues/q1/dlq/"+dead+"/requeue", nil).problem(t, 404)
	// The pending one (never claimed) is cancelled; a finished one is 409.
	pending := a.do("GET", "/v1/queues/q1/tasks?status=PENDING&limit=1", nil).want(t, 200).JSON["tasks"].([]any)[0].(map[string]any)
	if pending["task_id"] == dead {
		pending = a.do("GET", "/v1/queues/q1/tasks?status=PENDING&limit=1&after="+a.do("GET", "/v1/queues/q1/tasks?status=PENDING&limit=1", nil).str("next"), nil).want(t, 200).JSON["tasks"].([]any)[0].(map[string]any)
	}
	if r := a.do("POST", qtaskPath("q1", pending, "cancel"), nil).want(t, 200); r.str("current_status") != "CANCELLED" {
		t.Fatalf("cancel: %s", r.Raw)
	}
	a.do("POST", qtaskPath("q1", pending, "cancel"), nil).problem(t, 409)
	// The requeued task is claimable again (and the retrying one, if its
	// backoff, full jitter from 0 to 1 s, has run out).
	again := a.qclaim("q1", sess, 5, "")
	ids := map[any]bool{}
	for _, tk := range again {
		ids[tk["task_id"]] = true
	}
	if !ids[dead] || len(again) > 2 || len(again) == 2 && !ids[got[1]["task_id"]] {
		t.Fatalf("after requeue claimed %v", again)
	}
}

// TestQueueSubmitNDJSON: an NDJSON body's malformed lines are reported by
// line number while every valid line is stored.
func TestQueueSubmitNDJSON(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	body := strings.Join([]string{
		`{"task_id":"n-1","task_type":"x"}`,
		`{"task_id":"n-2","task_type":`, // malformed
		``,
		`{"task_id":"n-3","task_type":"x","colour":"red"}`,               // unknown field
		`{"task_id":"n-4","task_type":"x","max_retries":"3"}`,            // wrong type
		`{"task_id":"n-5","task_type":"x","metadata":{"priority":5000}}`, // out of range
		`{"task_id":"n-6","task_type":"x"}`,
	}, "\n") + "\n"
	r := a.do("POST", "/v1/queues/nd/tasks", body, "Content-Type: application/x-ndjson").want(t, 200)
	if r.num("submitted") != 2 {
		t.Fatalf("%s", r.Raw)
	}
	var lines []int
	for _, rj := range r.JSON["rejected"].([]any) {
		lines = append(lines, int(rj.(map[string]any)["line"].(float64)))
	}
	if fmt.Sprint(lines) != "[2 4 5 6]" {
		t.Fatalf("rejected lines %v: %s", lines, r.Raw)
	}
	for _, id := range []string{"n-1", "n-6"} {
		a.do("GET", "/v1/queues/nd/tasks/"+id, nil).want(t, 200)
	}
	if st := a.do("GET", "/v1/queues/nd/stats", nil).want(t, 200); st.num("pending") != 2 {
		t.Fatalf("stats %s", st.Raw)
	}
}

// TestQueueClaimConcurrent: sessions claiming and acking over HTTP at once
// claim each task exactly once, and every task succeeds.
func TestQueueClaimConcurrent(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/cc/tasks", qtasksJSON("c", 40)).want(t, 200)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	for range 4 {
		sess := a.session(10)
		wg.Go(func() {
			for {
				got := a.qclaim("cc", sess, 3, "")
				if len(got) == 0 {
					return
				}
				for _, tk := range got {
					mu.Lock()
					seen[tk["task_id"].(string)]++
					mu.Unlock()
					a.do("POST", qtaskPath("cc", tk, "ack"), qfence(sess, tk)).want(t, 200)
				}
			}
		})
	}
	wg.Wait()
	if len(seen) != 40 {
		t.Fatalf("claimed %d distinct tasks, want 40", len(seen))
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("%s claimed %d times", id, n)
		}
	}
	if st := a.do("GET", "/v1/queues/cc/stats", nil).want(t, 200); st.num("succeeded") != 40 || st.num("pending")+st.num("running") != 0 {
		t.Fatalf("stats %s", st.Raw)
	}
}

// TestClaimLongPollWakes: a claim waiting on an empty queue is answered
// by the queue's watch once a task is submitted, not by its wait's end:
// nothing else ends the wait (no periodic claim), so an answer with the
// task well before the 8 s wait ran out was woken by the watch. Counted
// as a decision, not timed tightly: a busy machine may take a while.
func TestClaimLongPollWakes(t *testing.T) {
	a := newAPI(t)
	sess := a.session(10)
	type result struct {
		tasks []map[string]any
		at    time.Time
	}
	done := make(chan result, 1)
	go func() {
		tasks := a.qclaim("lp", sess, 1, "8s")
		done <- result{tasks, time.Now()}
	}()
	time.Sleep(500 * time.Millisecond) // the claim is waiting
	select {
	case r := <-done:
		t.Fatalf("the claim returned before any submission: %v", r.tasks)
	default:
	}
	a.do("POST", "/v1/queues/lp/tasks", qtasksJSON("lp", 1)).want(t, 200)
	submitted := time.Now()
	r := <-done
	if len(r.tasks) != 1 {
		t.Fatalf("claimed %v", r.tasks)
	}
	if lag := r.at.Sub(submitted); lag > 4*time.Second {
		t.Fatalf("the claim answered %v after the submission: by its 8 s wait's end, not by the queue's watch", lag)
	}
	// An empty wait ends with no tasks.
	start := time.Now()
	if got := a.qclaim("lp", sess, 1, "300ms"); len(got) != 0 || time.Since(start) < 300*time.Millisecond {
		t.Fatalf("empty claim: %v after %v", got, time.Since(start))
	}
}

// TestClaimSessionExpires: the claims of a session that stops its
// keepalives are freed within TTL + 1 s: another session claims the task
// (attempt 2), and the first session's late heartbeat and ack get 409.
func TestClaimSessionExpires(t *testing.T) {
	a := newAPI(t)
	a.do("POST", "/v1/queues/ex/tasks", qtasksJSON("ex", 1)).want(t, 200)
	dying := a.session(2)
	got := a.qclaim("ex", dying, 1, "")
	if len(got) != 1 {
		t.Fatalf("claimed %v", got)
	}
	claimed := time.Now()
	other := a.session(10)
	again := a.qclaim("ex", other, 1, "5s")
	if len(again) != 1 || again[0]["attempt"].(float64) != 2 {
		t.Fatalf("second claim: %v", again)
	}
	if d := time.Since(claimed); d > 3*time.Second {
		t.Fatalf("freed %v after the claim, want within TTL + 1 s", d)
	}
	a.do("POST", qtaskPath("ex", got[0], "heartbeat"), qfence(dying, got[0])).problem(t, 409)
	a.do("POST", qtaskPath("ex", got[0], "ack"), qfence(dying, got[0])).problem(t, 409)
	a.do("POST", qtaskPath("ex", again[0], "ack"), qfence(other, again[0], "result", "ok")).want(t, 200)
}

// TestQueueAdminRoutes: purge and requeue of the whole DLQ need the admin
// role; a write token gets 403 and changes nothing.
func TestQueueAdminRoutes(t *testing.T) {
	t.Parallel()
	writer, admin := strings.Repeat("w", 20), strings.Repeat("a", 20)
	auth, err := httpapi.NewAuth([]httpapi.AuthEntry{
		{Name: "writer", Token: writer, Namespaces: []string{"*"}, Role: "write"},
		{Name: "admin", Token: admin, Namespaces: []string{"*"}, Role: "admin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	a := newAPI(t, func(c *httpapi.Config) { c.Auth = auth })
	a.token = writer
	a.do("POST", "/v1/queues/ad/tasks", qtasksJSON("ad", 2)).want(t, 200)
	sess := a.session(10)
	for _, tk := range a.qclaim("ad", sess, 2, "") {
		a.do("POST", qtaskPath("ad", tk, "fail"), qfence(sess, tk, "error", "no", "permanent", true)).want(t, 200)
	}
	before := a.keyCount()
	a.do("POST", "/v1/queues/ad/dlq/requeue", nil).problem(t, 403)
	a.do("DELETE", "/v1/queues/ad/dlq", nil).problem(t, 403)
	a.do("DELETE", "/v1/queues/ad/dlq/ad-0", nil).problem(t, 403)
	if after := a.keyCount(); after != before {
		t.Fatalf("keys %d → %d", before, after)
	}
	a.token = admin
	if r := a.do("DELETE", "/v1/queues/ad/dlq/ad-0", nil).want(t, 200); r.num("count") != 1 {
		t.Fatalf("purge one: %s", r.Raw)
	}
	if r := a.do("POST", "/v1/queues/ad/dlq/requeue", nil).want(t, 200); r.num("count") != 1 {
		t.Fatalf("requeue all: %s", r.Raw)
	}
	a.do("DELETE", "/v1/queues/ad/dlq", nil).want(t, 200)
	if st := a.do("GET", "/v1/queues/ad/stats", nil).want(t, 200); st.num("dead") != 0 || st.num("pending") != 1 {
		t.Fatalf("stats %s", st.Raw)
	}
}

// TestQueueSubmitTooLarge: a submission over MaxSubmitBytes gets 413 and
// stores nothing.
func TestQueueSubmitTooLarge(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	before := a.keyCount()
	for _, ct := range []string{"application/json", "application/x-ndjson"} {
		body := io.MultiReader(strings.NewReader(`[`), &qzeros{n: httpapi.MaxSubmitBytes})
		req, _ := http.NewRequest("POST", a.base+"/v1/queues/big/tasks", body)
		req.ContentLength = httpapi.MaxSubmitBytes + 1
		req.Header.Set("Content-Type", ct)
		req.Header.Set(httpapi.NamespaceHeader, a.ns)
		resp, err := a.hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 413 || !strings.Contains(string(raw), "too large") {
			t.Fatalf("%s: %d %s", ct, resp.StatusCode, raw)
		}
	}
	if after := a.keyCount(); after != before {
		t.Fatalf("keys %d → %d", before, after)
	}
}

// qzeros reads n spaces.
type qzeros struct{ n int }

func (z *qzeros) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	k := min(len(p), z.n)
	for i := range p[:k] {
		p[i] = ' '
	}
	z.n -= k
	return k, nil
}

// TestClaimOfALeftClientHandedBack: tasks claimed for a request whose
// client left before the answer was written are handed back, claimable at
// once by another session with the same attempt, not held under the first
// session (which lives on) until it ends.
func TestClaimOfALeftClientHandedBack(t *testing.T) {
	a := newAPI(t)
	a.do("POST", "/v1/queues/left/tasks", qtasksJSON("left", 2)).want(t, 200)
	entered := make(chan struct{})
	hooked := make(chan bool, 1)
	restore := httpapi.SetAfterClaim(func(ctx context.Context, q string) {
		if q != "left" {
			return
		}
		close(entered)
		select { // the client gives up meanwhile
		case <-ctx.Done():
			hooked <- true
		case <-time.After(10 * time.Second):
			hooked <- false
		}
	})
	defer restore()
	sess := a.session(30)
	body, _ := json.Marshal(map[string]any{"session": sess, "max": 2})
	cctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(cctx, "POST", a.base+"/v1/queues/left/claim", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	answered := make(chan error, 1)
	go func() {
		r, err := http.DefaultClient.Do(req)
		if err == nil {
			r.Body.Close()
			err = fmt.Errorf("the claim answered %d; want the client to give up first", r.StatusCode)
		}
		answered <- err
	}()
	select { // the claim has its tasks: the client gives up now
	case <-entered:
		cancel()
	case err := <-answered:
		t.Fatalf("the claim ended before it had its tasks: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("the claim did not get its tasks within 20 s")
	}
	if err := <-answered; !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if !<-hooked {
		t.Fatal("the request's context did not end when its client left")
	}
	restore()
	// The server hands them back after the hook: both PENDING again.
	for _, id := range []string{"left-0", "left-1"} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			st := a.do("GET", "/v1/queues/left/tasks/"+id, nil).want(t, 200).str("current_status")
			if st == "PENDING" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("task %s is %s 5 s after its client left, want PENDING (handed back)", id, st)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	other := a.session(30)
	got := a.qclaim("left", other, 2, "2s")
	if len(got) != 2 {
		t.Fatalf("another session claimed %d tasks, want both handed back", len(got))
	}
	for _, tk := range got {
		if tk["attempt"].(float64) != 1 {
			t.Fatalf("task %v: attempt %v, want 1 (a hand back does not count)", tk["task_id"], tk["attempt"])
		}
		a.do("POST", qtaskPath("left", tk, "ack"), qfence(other, tk)).want(t, 200)
	}
}

// TestClaimFillsAcrossSegments: one claim with max 10 of 4 pending tasks
// submitted in two requests (two segments) answers the 4.
func TestClaimFillsAcrossSegments(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/fill/tasks", qtasksJSON("a", 2)).want(t, 200)
	a.do("POST", "/v1/queues/fill/tasks", qtasksJSON("b", 2)).want(t, 200)
	sess := a.session(30)
	if got := a.qclaim("fill", sess, 10, ""); len(got) != 4 {
		t.Fatalf("claimed %d tasks of 4 pending in 2 segments with max 10", len(got))
	}
}
