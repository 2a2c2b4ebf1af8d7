package httpapi_test

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// sseUntilEnd reads GET path as SSE until its end event, and returns
// the messages' types and the end's reason ("" if none came in 10s).
func (a *api) sseUntilEnd(path string) (types []string, reason string) {
	a.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", a.base+path, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Drover-Namespace", a.ns)
	r, err := a.hc.Do(req)
	if err != nil {
		a.t.Fatal(err)
	}
	defer r.Body.Close()
	sc := bufio.NewScanner(r.Body)
	kind := ""
	for sc.Scan() {
		line := sc.Text()
		if v, ok := strings.CutPrefix(line, "event: "); ok {
			kind = v
		}
		v, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		var ev struct{ Type, Reason string }
		_ = json.Unmarshal([]byte(v), &ev)
		if kind == "end" {
			return types, ev.Reason
		}
		types = append(types, ev.Type)
	}
	return types, ""
}

// TestStreamOfAnEndedTaskWithoutDone: the SSE follower of a task that
// ended with no done stored (its done lost, as when a worker dies
// between the outcome and the done) gets every stored event, then the
// end "ended"; a stream with its done ends "done".
func TestStreamOfAnEndedTaskWithoutDone(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/eq/tasks", qtasksJSON("e", 1)).want(t, 200)
	sess := a.session(30)
	task := a.qclaim("eq", sess, 1, "5s")[0]
	tok := map[string]any{"type": "token", "data": map[string]any{"text": "x"}}
	a.do("POST", "/v1/tasks/e-0/stream/events", qfence(sess, task, "events", []any{tok, tok})).want(t, 200)
	a.do("POST", "/v1/queues/eq/tasks/e-0/cancel", nil).want(t, 200)

	types, reason := a.sseUntilEnd("/v1/tasks/e-0/stream")
	if strings.Join(types, " ") != "attempt_started token token done" || reason != "done" {
		t.Fatalf("with its done: %v, end %q", types, reason)
	}
	ctx := context.Background()
	resp, err := a.cli.Get(ctx, keyspace.MustNew(a.ns).StreamChunks("e-0"), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), `"done"`) {
		t.Fatalf("the done chunk: %v %v", resp, err)
	}
	if _, err := a.cli.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	types, reason = a.sseUntilEnd("/v1/tasks/e-0/stream")
	if strings.Join(types, " ") != "attempt_started token token" || reason != "ended" {
		t.Fatalf("without its done: %v, end %q", types, reason)
	}
}

// TestBatchOutcomesEndStreams: outcomes sent in a batch with streamed
// end their tasks' streams as the single ack and fail do: a success
// with done, a failure to be retried and a sleep with attempt_ended;
// an outcome without streamed leaves its stream without done.
func TestBatchOutcomesEndStreams(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/bq/tasks", qtasksJSON("b", 4)).want(t, 200)
	sess := a.session(30)
	tasks := a.qclaim("bq", sess, 4, "5s")
	if len(tasks) != 4 {
		t.Fatalf("claimed %d tasks, want 4", len(tasks))
	}
	byID := map[string]map[string]any{}
	for _, tk := range tasks {
		byID[tk["task_id"].(string)] = tk
		a.do("POST", "/v1/tasks/"+tk["task_id"].(string)+"/stream/events",
			qfence(sess, tk, "events", []any{map[string]any{"type": "token", "data": map[string]any{"text": "x"}}})).want(t, 200)
	}
	outcome := func(id string, extra ...any) map[string]any {
		o := map[string]any{"task_id": id, "token": byID[id]["token"]}
		for i := 0; i+1 < len(extra); i += 2 {
			o[extra[i].(string)] = extra[i+1]
		}
		return o
	}
	a.do("POST", "/v1/queues/bq/outcomes", map[string]any{"session": sess, "outcomes": []any{
		outcome("b-0", "ok", true, "streamed", true),
		outcome("b-1", "error", "flaky", "streamed", true),
		outcome("b-2", "sleep_for", "1h", "streamed", true),
		outcome("b-3", "ok", true),
	}}).want(t, 200)

	if types, reason := a.sseUntilEnd("/v1/tasks/b-0/stream"); strings.Join(types, " ") != "attempt_started token done" || reason != "done" {
		t.Fatalf("the success: %v, end %q", types, reason)
	}
	if _, types := a.sseEvents("/v1/tasks/b-1/stream", 3); strings.Join(types, " ") != "attempt_started token attempt_ended" {
		t.Fatalf("the failure to retry: %v", types)
	}
	if _, types := a.sseEvents("/v1/tasks/b-2/stream", 3); strings.Join(types, " ") != "attempt_started token attempt_ended" {
		t.Fatalf("the sleep: %v", types)
	}
	if types, reason := a.sseUntilEnd("/v1/tasks/b-3/stream"); strings.Join(types, " ") != "attempt_started token" || reason != "ended" {
		t.Fatalf("without streamed: %v, end %q", types, reason)
	}
}

// TestStreamOfATaskEndedLongAgoEndsAtOnce: the SSE follower of a task
// that ended, with no done, longer ago than the wait for a late done
// ends at once ("ended"), whatever the wait and the interval of its
// checks (an hour each here).
func TestStreamOfATaskEndedLongAgoEndsAtOnce(t *testing.T) { // not parallel: it sets the package's waits
	a := newAPI(t)
	a.do("POST", "/v1/queues/oq/tasks", qtasksJSON("o", 1)).want(t, 200)
	sess := a.session(30)
	task := a.qclaim("oq", sess, 1, "5s")[0]
	tok := map[string]any{"type": "token", "data": map[string]any{"text": "x"}}
	a.do("POST", "/v1/tasks/o-0/stream/events", qfence(sess, task, "events", []any{tok})).want(t, 200)
	a.do("POST", "/v1/queues/oq/tasks/o-0/cancel", nil).want(t, 200)
	ctx := context.Background()
	keys := keyspace.MustNew(a.ns)
	resp, err := a.cli.Get(ctx, keys.StreamChunks("o-0"), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil || len(resp.Kvs) != 1 || !strings.Contains(string(resp.Kvs[0].Value), `"done"`) {
		t.Fatalf("the done chunk: %v %v", resp, err)
	}
	if _, err := a.cli.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	// The cancel two hours ago.
	rec, err := a.cli.Get(ctx, keys.TaskRecord("o-0"))
	if err != nil || len(rec.Kvs) != 1 {
		t.Fatalf("the task's record: %v %v", rec, err)
	}
	var r map[string]any
	if err := json.Unmarshal(rec.Kvs[0].Value, &r); err != nil {
		t.Fatal(err)
	}
	trs, _ := r["transitions"].([]any)
	if len(trs) == 0 {
		t.Fatalf("the task's record has no transitions: %s", rec.Kvs[0].Value)
	}
	trs[len(trs)-1].(map[string]any)["at"] = time.Now().Add(-2 * time.Hour).UTC().Format(time.RFC3339Nano)
	b, _ := json.Marshal(r)
	if _, err := a.cli.Put(ctx, keys.TaskRecord("o-0"), string(b)); err != nil {
		t.Fatal(err)
	}
	defer httpapi.SetStreamEnds(time.Hour, time.Hour)()
	types, reason := a.sseUntilEnd("/v1/tasks/o-0/stream")
	if strings.Join(types, " ") != "attempt_started token" || reason != "ended" {
		t.Fatalf("the stream of a task cancelled two hours ago: %v, end %q (\"\": none in 10s)", types, reason)
	}
}

// lastEvent is the type and outcome of the last event stored of task
// id's stream ("" when it has none).
func (a *api) lastEvent(id string) (typ, outcome string) {
	a.t.Helper()
	resp, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).StreamChunks(id), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		a.t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return "", ""
	}
	var c struct {
		List []struct {
			Type string                   `json:"t"`
			Data struct{ Outcome string } `json:"d"`
		} `json:"list"`
	}
	if err := json.Unmarshal(resp.Kvs[0].Value, &c); err != nil || len(c.List) == 0 {
		a.t.Fatalf("the last chunk of %s: %s %v", id, resp.Kvs[0].Value, err)
	}
	ev := c.List[len(c.List)-1]
	return ev.Type, ev.Data.Outcome
}

// TestWaitOutcomeEndsAttempt: a wait_signal outcome sent with streamed
// that parks its task (WAITING) closes the attempt's events with
// attempt_ended "waiting", as a Go worker's wait does, by the time the
// outcome is answered.
func TestWaitOutcomeEndsAttempt(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/wq/tasks", qtasksJSON("w", 1)).want(t, 200)
	sess := a.session(30)
	task := a.qclaim("wq", sess, 1, "5s")[0]
	tok := map[string]any{"type": "token", "data": map[string]any{"text": "x"}}
	a.do("POST", "/v1/tasks/w-0/stream/events", qfence(sess, task, "events", []any{tok})).want(t, 200)
	a.do("POST", "/v1/queues/wq/outcomes", map[string]any{"session": sess, "outcomes": []any{map[string]any{
		"task_id": "w-0", "token": task["token"], "wait_signal": map[string]any{"names": []string{"go"}}, "streamed": true,
	}}}).want(t, 200)
	if typ, outcome := a.lastEvent("w-0"); typ != "attempt_ended" || outcome != "waiting" {
		t.Fatalf("the stream of a task parked waiting ends with %q %q, want attempt_ended waiting", typ, outcome)
	}
}
