package httpapi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/task"
)

// TestAgentTaskStreamOverHTTP: an agent task's claim appends to the
// task's stream (the route of queue tasks); after a takeover the next
// claim's events follow the attempt_lost boundary and the stale claim
// gets 409; the last step's write ends the stream with done; a follower
// from the start sees the whole sequence, then the end.
func TestAgentTaskStreamOverHTTP(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("GET", "/v1/tasks/ag-1/stream", nil).problem(t, 404) // not claimed yet: unknown
	s1, s2 := a.session(30), a.session(30)
	tok1 := a.do("POST", "/v1/agent-tasks/ag-1/claim", map[string]any{"session": s1, "steps": 2}).want(t, 200).num("token")
	if p := a.do("GET", "/v1/tasks/ag-1/stream", nil).want(t, 200); len(p.JSON["events"].([]any)) != 0 {
		t.Fatalf("a claimed task's stream before any emit: %s", p.Raw)
	}
	path := "/v1/tasks/ag-1/stream/events"
	tokens := func(texts ...string) []any {
		out := make([]any, len(texts))
		for i, s := range texts {
			out[i] = map[string]any{"type": "token", "data": map[string]any{"text": s}}
		}
		return out
	}
	r := a.do("POST", path, map[string]any{"session": s1, "token": tok1, "events": tokens("Hel", "lo")}).want(t, 200)
	if r.num("first") != 2 || r.num("last") != 3 {
		t.Fatalf("appended %s, want 2..3 (1 is attempt_started)", r.Raw)
	}
	a.step("ag-1", 1, s1, tok1, "one").want(t, 200)

	// Bad input: nothing stored.
	keys := a.keyCount()
	a.do("POST", path, map[string]any{"session": s1, "token": tok1 + 1000, "events": tokens("x")}).problem(t, 409)
	big := map[string]any{"type": "log", "data": strings.Repeat("x", 70<<10)}
	a.do("POST", path, map[string]any{"session": s1, "token": tok1, "events": []any{big}}).problem(t, 413)
	a.do("POST", path, map[string]any{"session": s1, "token": tok1, "events": []any{map[string]any{"type": "attempt_lost"}}}).problem(t, 400)
	a.do("POST", "/v1/tasks/never-claimed/stream/events", map[string]any{"session": s1, "token": tok1, "events": tokens("x")}).problem(t, 404)
	full := &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.8, LowWater: 0.7, Since: time.Now()}
	if err := storeguard.Set(context.Background(), a.cli, full, keyspace.MustNew(a.ns)); err != nil {
		t.Fatal(err)
	}
	keys++ // the guard key
	a.do("POST", path, map[string]any{"session": s1, "token": tok1, "events": tokens("x")}).problem(t, 507)
	if n := a.keyCount(); n != keys {
		t.Fatalf("an append to a full store changed the keys: %d, then %d", keys, n)
	}
	if err := storeguard.Clear(context.Background(), a.cli, keyspace.MustNew(a.ns)); err != nil {
		t.Fatal(err)
	}
	keys--
	if n := a.keyCount(); n != keys {
		t.Fatalf("refused appends changed the keys: %d, then %d", keys, n)
	}

	// The first holder's session ends (as its process died); another takes over.
	a.do("DELETE", "/v1/sessions/"+s1, nil).want(t, 204)
	tok2 := a.do("POST", "/v1/agent-tasks/ag-1/claim", map[string]any{"session": s2, "steps": 2}).want(t, 200).num("token")
	a.do("POST", path, map[string]any{"session": s1, "token": tok1, "events": tokens("stale")}).problem(t, 409)
	a.do("POST", path, map[string]any{"session": s2, "token": tok2, "events": tokens("World")}).want(t, 200)
	a.do("POST", path, map[string]any{"session": s1, "token": tok1, "events": tokens("stale")}).problem(t, 409)
	a.step("ag-1", 2, s2, tok2, "two").want(t, 200) // the last step: completes the task

	ids, types := a.sseEvents("/v1/tasks/ag-1/stream", 7)
	want := "[attempt_started token token attempt_lost attempt_started token done]"
	if fmt.Sprint(types) != want || ids[6] != 7 {
		t.Fatalf("SSE from the start: ids %v types %v, want %s", ids, types, want)
	}
	page := a.do("GET", "/v1/tasks/ag-1/stream", nil).want(t, 200)
	var p struct {
		Events []struct {
			Attempt int
			Type    string
			Data    json.RawMessage
		}
		Done bool
	}
	if err := json.Unmarshal(page.Raw, &p); err != nil || !p.Done {
		t.Fatalf("page: %s (%v)", page.Raw, err)
	}
	for i, ev := range p.Events {
		if want := 1 + min(1, i/3); ev.Attempt != want || strings.Contains(string(ev.Data), "stale") {
			t.Fatalf("event %d: %+v, want attempt %d and nothing stale", i+1, ev, want)
		}
	}
	if !strings.Contains(string(p.Events[6].Data), `"outcome":"succeeded"`) {
		t.Fatalf("done: %s", p.Events[6].Data)
	}
	a.do("POST", path, map[string]any{"session": s2, "token": tok2, "events": tokens("late")}).problem(t, 409) // released with the last step
}

// TestAgentTaskStreamParkedAndReleased: a step write that parks the task
// (a sleep) ends the claim's events with attempt_ended; so does a
// release; a claim that wrote nothing writes no end.
func TestAgentTaskStreamParkedAndReleased(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	s := a.session(30)
	tok := a.claim("ag-nap", s, 200).num("token")
	a.do("POST", "/v1/tasks/ag-nap/stream/events", map[string]any{"session": s, "token": tok, "events": []any{map[string]any{"type": "log"}}}).want(t, 200)
	a.do("PUT", "/v1/agent-tasks/ag-nap/steps/1", map[string]any{"session": s, "token": tok, "steps": 3, "state": b64("x"), "sleep_for": "1h"}).want(t, 200)
	_, types := a.sseEvents("/v1/tasks/ag-nap/stream", 3)
	if fmt.Sprint(types) != "[attempt_started log attempt_ended]" {
		t.Fatalf("after a sleeping write: %v", types)
	}
	tok = a.claim("ag-rel", s, 200).num("token")
	a.do("DELETE", fmt.Sprintf("/v1/agent-tasks/ag-rel/claim?session=%s&token=%d", s, int64(tok)), nil).want(t, 204)
	a.do("GET", "/v1/tasks/ag-rel/stream", nil).problem(t, 404) // released, no checkpoint, no stream: unknown
	tok = a.claim("ag-rel", s, 200).num("token")
	a.do("POST", "/v1/tasks/ag-rel/stream/events", map[string]any{"session": s, "token": tok, "events": []any{map[string]any{"type": "log"}}}).want(t, 200)
	a.do("DELETE", fmt.Sprintf("/v1/agent-tasks/ag-rel/claim?session=%s&token=%d", s, int64(tok)), nil).want(t, 204)
	p := a.do("GET", "/v1/tasks/ag-rel/stream", nil).want(t, 200)
	if evs := p.JSON["events"].([]any); len(evs) != 3 || !strings.Contains(string(p.Raw), `"handed back"`) {
		t.Fatalf("after a release: %s", p.Raw)
	}
	// Later claims that emit nothing, on a stream an earlier claim wrote:
	// a release, and a step write that parks the task, add no attempt.
	tok = a.claim("ag-rel", s, 200).num("token")
	a.do("DELETE", fmt.Sprintf("/v1/agent-tasks/ag-rel/claim?session=%s&token=%d", s, int64(tok)), nil).want(t, 204)
	tok = a.claim("ag-rel", s, 200).num("token")
	a.do("PUT", "/v1/agent-tasks/ag-rel/steps/1", map[string]any{"session": s, "token": tok, "steps": 3, "state": b64("x"), "sleep_for": "1h"}).want(t, 200)
	p = a.do("GET", "/v1/tasks/ag-rel/stream", nil).want(t, 200)
	if evs := p.JSON["events"].([]any); len(evs) != 3 {
		t.Fatalf("claims that emitted nothing wrote the stream: %s", p.Raw)
	}
}

// TestAgentTaskStreamEndedByARepeatedParkingWrite: a step write that
// parked the task and died before it ended the claim's events and
// released it (its checkpoint stored, nothing after) is sent again: the
// repeat ends the attempt as the first would have, and nothing of the
// claim follows the end.
func TestAgentTaskStreamEndedByARepeatedParkingWrite(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := context.Background()
	s := a.session(30)
	tok := a.claim("ag-crash", s, 200).num("token")
	a.do("POST", "/v1/tasks/ag-crash/stream/events", map[string]any{"session": s, "token": tok, "events": []any{map[string]any{"type": "log"}}}).want(t, 200)
	store, err := task.NewStore(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	cp, err := store.Load(ctx, "ag-crash")
	if err != nil {
		t.Fatal(err)
	}
	f := newClaimFence(t, a, "ag-crash", tok)
	now := time.Now().UTC()
	next := task.Checkpoint{TaskID: "ag-crash", Step: 1, StepName: "nap", Steps: 3, State: []byte("x"), Worker: "w", Token: f.tok, At: now, SleepUntil: now.Add(time.Hour)}
	if err := store.Commit(ctx, f, cp, &next, task.StepRecord{Step: 1, Name: "nap", Worker: "w", Token: f.tok, StartedAt: now, FinishedAt: now}); err != nil {
		t.Fatal(err)
	}
	a.do("PUT", "/v1/agent-tasks/ag-crash/steps/1", map[string]any{"session": s, "token": tok, "name": "nap", "steps": 3, "state": b64("x"), "sleep_for": "1h"}).want(t, 200)
	p := a.do("GET", "/v1/tasks/ag-crash/stream", nil).want(t, 200)
	var types []any
	for _, e := range p.JSON["events"].([]any) {
		types = append(types, e.(map[string]any)["type"])
	}
	if fmt.Sprint(types) != "[attempt_started log attempt_ended]" {
		t.Fatalf("after the repeated write: %s", p.Raw)
	}
	if a.held(t, "ag-crash") {
		t.Fatal("the repeated write left the claim held")
	}
}

// TestAgentTaskStreamOnAQueueTasksID: an agent task whose id is also a
// queue's task's appends under its claim (not refused as the queue
// task's stale claim); a token that is neither's is still 409.
func TestAgentTaskStreamOnAQueueTasksID(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/q/tasks", `[{"task_id": "both", "task_type": "x"}]`).want(t, 200)
	s := a.session(30)
	tok := a.claim("both", s, 200).num("token")
	a.do("POST", "/v1/tasks/both/stream/events", map[string]any{"session": s, "token": tok, "events": []any{map[string]any{"type": "log"}}}).want(t, 200)
	a.do("POST", "/v1/tasks/both/stream/events", map[string]any{"session": s, "token": tok + 1000, "events": []any{map[string]any{"type": "log"}}}).problem(t, 409)
	p := a.do("GET", "/v1/tasks/both/stream", nil).want(t, 200)
	if evs := p.JSON["events"].([]any); len(evs) != 2 {
		t.Fatalf("stream: %s", p.Raw)
	}
}
