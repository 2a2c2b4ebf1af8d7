package httpapi_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

// sseEvents reads up to n message events of GET path as SSE, with
// headers hdr, and returns their ids and types.
func (a *api) sseEvents(path string, n int, hdr ...string) (ids []int64, types []string) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Drover-Namespace", a.ns)
	for _, h := range hdr {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	r, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer r.Body.Close()
	if r.StatusCode != 200 {
		b, _ := io.ReadAll(r.Body)
		a.t.Fatalf("GET %s: %d %s", path, r.StatusCode, b)
	}
	sc := bufio.NewScanner(r.Body)
	for len(types) < n && sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "id: "); ok {
			id, _ := strconv.ParseInt(v, 10, 64)
			ids = append(ids, id)
		}
		if v, ok := strings.CutPrefix(line, "data: "); ok && len(types) < len(ids) {
			var ev struct{ Type string }
			_ = json.Unmarshal([]byte(v), &ev)
			types = append(types, ev.Type)
		}
	}
	return ids, types
}

// TestTaskStreamOverHTTP: an external worker appends events under its
// claim's token; followers resume with ?from= and Last-Event-ID; bad
// input is a problem and stores nothing.
func TestTaskStreamOverHTTP(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/sq/tasks", qtasksJSON("s", 1)).want(t, 200)
	sess := a.session(30)
	task := a.qclaim("sq", sess, 1, "5s")[0]
	path := "/v1/tasks/s-0/stream/events"
	ev := func(typ string) map[string]any {
		return map[string]any{"type": typ, "data": map[string]any{"text": typ}}
	}
	r := a.do("POST", path, qfence(sess, task, "events", []any{ev("token"), ev("token")})).want(t, 200)
	if r.num("first") != 2 || r.num("last") != 3 {
		t.Fatalf("appended %s, want 2..3 (1 is attempt_started)", r.Raw)
	}
	more, _ := json.Marshal(qfence(sess, task, "events", []any{ev("progress")}))
	go func() { // a follower waiting for more gets it as it comes (t.Errorf only: not the test's goroutine)
		time.Sleep(100 * time.Millisecond)
		req, _ := http.NewRequest("POST", a.base+path, bytes.NewReader(more))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Drover-Namespace", a.ns)
		r, err := a.hc.Do(req)
		if err != nil {
			t.Errorf("append while followed: %v", err)
			return
		}
		_ = r.Body.Close()
		if r.StatusCode != 200 {
			t.Errorf("append while followed: status %d", r.StatusCode)
		}
	}()
	ids, types := a.sseEvents("/v1/tasks/s-0/stream", 4)
	if len(ids) != 4 || ids[0] != 1 || ids[3] != 4 || types[0] != "attempt_started" || types[3] != "progress" {
		t.Fatalf("SSE from the start: ids %v types %v", ids, types)
	}
	if ids, _ := a.sseEvents("/v1/tasks/s-0/stream?from=1", 2, "Last-Event-ID: 2"); len(ids) != 2 || ids[0] != 3 || ids[1] != 4 {
		t.Fatalf("SSE after Last-Event-ID 2: ids %v", ids)
	}
	if ids, _ := a.sseEvents("/v1/tasks/s-0/stream?from=4", 1); len(ids) != 1 || ids[0] != 4 {
		t.Fatalf("SSE from 4: ids %v", ids)
	}
	page := a.do("GET", "/v1/tasks/s-0/stream?from=2", nil).want(t, 200)
	if evs := page.JSON["events"].([]any); len(evs) != 3 || page.num("next") != 5 {
		t.Fatalf("page from 2: %s", page.Raw)
	}

	keys := a.keyCount()
	stale := map[string]any{"session": sess, "token": task["token"].(float64) + 1000, "events": []any{ev("log")}}
	a.do("POST", path, stale).problem(t, 409)
	a.do("POST", "/v1/tasks/nope/stream/events", qfence(sess, task, "events", []any{ev("log")})).problem(t, 404)
	a.do("POST", path, qfence(sess, task, "events", []any{ev("done")})).problem(t, 400)
	big := map[string]any{"type": "log", "data": strings.Repeat("x", 70<<10)}
	a.do("POST", path, qfence(sess, task, "events", []any{big})).problem(t, 413)
	a.do("GET", "/v1/tasks/nope/stream", nil).problem(t, 404)
	a.do("GET", "/v1/tasks/s-0/stream", nil, "Last-Event-ID: x1").problem(t, 400)
	a.do("GET", "/v1/tasks/s-0/stream", nil, "Last-Event-ID: 9223372036854775807").problem(t, 400)
	if n := a.keyCount(); n != keys {
		t.Fatalf("refused requests changed the keys: %d, then %d", keys, n)
	}

	// The worker's ack closes the stream: done, then the SSE end.
	a.do("POST", qtaskPath("sq", task, "ack"), qfence(sess, task, "result", "fine")).want(t, 200)
	ids, types = a.sseEvents("/v1/tasks/s-0/stream?from=5", 1)
	if len(ids) != 1 || ids[0] != 5 || types[0] != "done" {
		t.Fatalf("after the ack: ids %v types %v, want done at 5", ids, types)
	}
	page = a.do("GET", "/v1/tasks/s-0/stream?from=5", nil).want(t, 200)
	if ev := page.JSON["events"].([]any)[0].(map[string]any); page.JSON["done"] != true || ev["data"].(map[string]any)["outcome"] != "succeeded" {
		t.Fatalf("done: %s", page.Raw)
	}
}

// TestStreamAppendAfterClaimLost: an append under a claim appended under
// before (its claim kept by the server) is refused once the claim is
// lost, and stores nothing: after the task's ack, after its session was
// deleted, and after a cancel.
func TestStreamAppendAfterClaimLost(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/lq/tasks", qtasksJSON("l", 3)).want(t, 200)
	ev := []any{map[string]any{"type": "token", "data": "x"}}
	streamLen := func(id string) int {
		return len(a.do("GET", "/v1/tasks/"+id+"/stream", nil).want(t, 200).JSON["events"].([]any))
	}
	lose := map[string]func(sess string, task map[string]any){
		"ack": func(sess string, task map[string]any) {
			a.do("POST", qtaskPath("lq", task, "ack"), qfence(sess, task)).want(t, 200)
		},
		"session deleted": func(sess string, _ map[string]any) {
			a.do("DELETE", "/v1/sessions/"+sess, nil).want(t, 204)
		},
		"cancel": func(_ string, task map[string]any) {
			a.do("POST", "/v1/queues/lq/tasks/"+task["task_id"].(string)+"/cancel", nil).want(t, 200)
		},
	}
	for _, how := range []string{"ack", "session deleted", "cancel"} {
		sess := a.session(30)
		task := a.qclaim("lq", sess, 1, "5s")[0]
		path := "/v1/tasks/" + task["task_id"].(string) + "/stream/events"
		a.do("POST", path, qfence(sess, task, "events", ev)).want(t, 200)
		a.do("POST", path, qfence(sess, task, "events", ev)).want(t, 200) // through the kept claim
		lose[how](sess, task)
		n := streamLen(task["task_id"].(string))
		a.do("POST", path, qfence(sess, task, "events", ev)).problem(t, 409)
		if got := streamLen(task["task_id"].(string)); got != n {
			t.Fatalf("%s: a refused append changed the stream: %d events, then %d", how, n, got)
		}
	}
}
