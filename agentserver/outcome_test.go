package agentserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
)

// startRun makes a thread and a run of it, claims the run's task as a
// runtime would, and answers the thread, the run's outcome path and the
// claim's token.
func startRun(t *testing.T, a *api, body map[string]any) (th, out string, token int64) {
	t.Helper()
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th = a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	body["assistant_id"] = "agent"
	id := a.must(200, "POST", "/threads/"+th+"/runs", body).Obj["run_id"].(string)
	return th, "/v1/agent-server/threads/" + th + "/runs/" + id + "/outcome", claimRun(t, a)
}

func valuesState(v map[string]any) map[string]any {
	return map[string]any{"values": v, "next": []any{}, "tasks": []any{}}
}

// A second outcome of a run that ended (a lost answer sent again, a task
// retried after its outcome) changes nothing: the run, its thread and the
// thread's state stay as the first left them.
func TestRepeatOutcomeChangesNothing(t *testing.T) {
	a := newAPI(t)
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{"x": 1.0})})
	got := a.must(200, "PUT", out, map[string]any{"token": token, "status": "error", "error": map[string]any{"error": "E", "message": "late"},
		"state": valuesState(map[string]any{"x": 2.0})}).Obj
	if got["status"] != "success" {
		t.Fatalf("repeat outcome answered run %v: want the first outcome's success", got["status"])
	}
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj; st["status"] != "idle" || st["values"].(map[string]any)["x"] != 1.0 {
		t.Fatalf("thread after a repeat outcome: %v %v, want idle with x=1", st["status"], st["values"])
	}
	if v := a.must(200, "GET", "/threads/"+th+"/state", nil).Obj["values"].(map[string]any)["x"]; v != 1.0 {
		t.Fatalf("thread state x=%v after a repeat outcome: want 1", v)
	}
}

// A run's error is stored cut to 16 KiB, marked as truncated.
func TestOutcomeCapsItsError(t *testing.T) {
	a := newAPI(t)
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "error",
		"error": map[string]any{"error": "ToolError", "message": strings.Repeat("é", 100<<10)}})
	id := strings.Split(out, "/")[6]
	e := storedRun(t, a, th, id)["error"].(map[string]any)
	msg := e["message"].(string)
	if e["error"] != "ToolError" || len(msg) > 16<<10 || !strings.Contains(msg, "truncated") || !strings.HasPrefix(msg, "éé") {
		t.Fatalf("stored error %v with a message of %d bytes: want ToolError, at most 16 KiB, marked truncated", e["error"], len(msg))
	}
}

// The run's record counts against what an outcome stores: with a large
// input and error, the run, its thread and the thread's state stored by
// one outcome stay within 1 MiB (well under etcd's request limit).
func TestOutcomeLeavesRoomForTheRunRecord(t *testing.T) {
	a := newAPI(t)
	th, out, token := startRun(t, a, map[string]any{"input": map[string]any{"text": strings.Repeat("i", 60<<10)}})
	state := func(cp string) map[string]any {
		s := valuesState(map[string]any{"text": strings.Repeat("x", 100<<10)})
		s["checkpoint"] = map[string]any{"checkpoint_id": cp}
		return s
	}
	var hist []any
	for i := range 12 {
		hist = append(hist, state(fmt.Sprint("h", i)))
	}
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "error", "state": state("h0"), "history": hist,
		"error": map[string]any{"error": "E", "message": strings.Repeat("m", 200<<10)}})
	sp := keyspace.MustNew(a.ns)
	total := 0
	for _, k := range []string{sp.AgentThread(th), sp.AgentThreadState(th), sp.AgentRun(th, strings.Split(out, "/")[6])} {
		got, err := a.cli.Get(context.Background(), k)
		if err != nil || len(got.Kvs) != 1 {
			t.Fatalf("%s: %v", k, err)
		}
		total += len(got.Kvs[0].Value)
	}
	if total > 1<<20 {
		t.Fatalf("one outcome stored %d bytes: want at most 1 MiB", total)
	}
}

// An outcome over 3 MiB is refused: the server stores about 1 MiB of it.
func TestOutcomeOverItsLimitIsRefused(t *testing.T) {
	a := newAPI(t)
	_, out, token := startRun(t, a, map[string]any{})
	var hist []any
	for range 8 {
		hist = append(hist, valuesState(map[string]any{"text": strings.Repeat("x", 500<<10)}))
	}
	a.must(413, "PUT", out, map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{}), "history": hist})
}

// A settle that leaves the thread busy (another run is active) still
// writes it, so that two settles racing each other conflict: the one
// retried sees the other's run ended and frees the thread.
func TestSettleWritesTheBusyThread(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	one, two := "1f0a0000-0000-4000-8000-000000000011", "1f0a0000-0000-4000-8000-000000000012"
	strandRun(t, a, th, one, time.Now().UTC())
	strandRun(t, a, th, two, time.Now().UTC())
	key := keyspace.MustNew(a.ns).AgentThread(th)
	before, err := a.cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	a.must(204, "POST", "/threads/"+th+"/runs/"+one+"/cancel", nil)
	after, err := a.cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if after.Kvs[0].ModRevision == before.Kvs[0].ModRevision {
		t.Fatalf("settling a run while another is active left the thread unwritten (revision %d)", after.Kvs[0].ModRevision)
	}
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj["status"]; st != "busy" {
		t.Fatalf("thread %v while its other run is active: want busy", st)
	}
	a.must(204, "POST", "/threads/"+th+"/runs/"+two+"/cancel", nil)
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj["status"]; st != "idle" {
		t.Fatalf("thread %v once both runs are cancelled: want idle", st)
	}
}

// A run whose input is more than its queue task takes is refused (400),
// not answered as a store failure to retry, and leaves its thread idle.
func TestRunTooLargeForItsTaskIsRefused(t *testing.T) {
	a := newAPI(t)
	a.must(200, "PUT", "/v1/agent-server/graphs/agent", map[string]any{})
	th := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	a.must(400, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent", "input": map[string]any{"text": strings.Repeat("i", 100<<10)}})
	if st := a.must(200, "GET", "/threads/"+th, nil).Obj["status"]; st != "idle" {
		t.Fatalf("thread %v after a refused run: want idle", st)
	}
}

// An outcome with history_append sends only the run's new states, down to
// one the thread's stored history holds: the server keeps its older states
// after them (at most history_limit in all). One whose last state the
// stored history does not hold is refused (412) and changes nothing.
func TestOutcomeAppendsToTheStoredHistory(t *testing.T) {
	a := newAPI(t)
	at := func(cp string) map[string]any {
		s := valuesState(map[string]any{"cp": cp})
		s["checkpoint"] = map[string]any{"checkpoint_id": cp}
		return s
	}
	states := func(cps ...string) []any {
		var out []any
		for _, cp := range cps {
			out = append(out, at(cp))
		}
		return out
	}
	history := func(th string) string {
		var ids []string
		for _, st := range a.must(200, "POST", "/threads/"+th+"/history", map[string]any{"limit": 100}).List {
			ids = append(ids, st["checkpoint"].(map[string]any)["checkpoint_id"].(string))
		}
		return strings.Join(ids, " ")
	}
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("c3"), "history": states("c3", "c2", "c1")})
	next := func() (string, int64) {
		id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
		return "/v1/agent-server/threads/" + th + "/runs/" + id + "/outcome", claimRun(t, a)
	}
	out, token = next()
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("c5"), "history": states("c5", "c4", "c3"),
		"history_append": true, "history_limit": 4})
	if got := history(th); got != "c5 c4 c3 c2" {
		t.Fatalf("history after an appended outcome: %q, want c5 c4 c3 c2 (the new states, then the stored ones, 4 at most)", got)
	}
	out, token = next()
	a.must(412, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("c7"), "history": states("c7", "c6"), "history_append": true})
	if got := history(th); got != "c5 c4 c3 c2" {
		t.Fatalf("history after a refused append: %q, want it unchanged", got)
	}
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("c7"), "history": states("c7", "c6", "c5")})
	if got := history(th); got != "c7 c6 c5" {
		t.Fatalf("history after the whole history was sent: %q, want c7 c6 c5", got)
	}
}

// A state update made on a checkpoint that the stored history does not
// hold (a run stopped before its outcome wrote it) leaves the history
// without that state: the next outcome may not append to it (412), and
// the whole history it sends then holds the stopped run's state.
func TestAppendRefusedAfterAnUpdateOnAnUnstoredCheckpoint(t *testing.T) {
	a := newAPI(t)
	at := func(cp, parent string) map[string]any {
		s := valuesState(map[string]any{"cp": cp})
		s["checkpoint"] = map[string]any{"checkpoint_id": cp}
		if parent != "" {
			s["parent_checkpoint"] = map[string]any{"checkpoint_id": parent}
		}
		return s
	}
	history := func(th string) string {
		var ids []string
		for _, st := range a.must(200, "POST", "/threads/"+th+"/history", map[string]any{"limit": 100}).List {
			ids = append(ids, st["checkpoint"].(map[string]any)["checkpoint_id"].(string))
		}
		return strings.Join(ids, " ")
	}
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("c1", ""), "history": []any{at("c1", "")}})
	tokens, release := make(chan int64, 1), make(chan struct{})
	defer close(release)
	runtime(t, a, func(ctx context.Context, p map[string]any, token int64) []byte {
		if p["op"] == "update_state" { // on a1, a checkpoint of a run stopped before its outcome
			raw, _ := json.Marshal(map[string]any{"checkpoint": map[string]any{"checkpoint_id": "u1"}, "state": at("u1", "a1")})
			return raw
		}
		tokens <- token
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	})
	a.must(200, "POST", "/threads/"+th+"/state", map[string]any{"values": map[string]any{"cp": "u1"}, "as_node": "agent"})
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	out = "/v1/agent-server/threads/" + th + "/runs/" + id + "/outcome"
	select {
	case token = <-tokens:
	case <-time.After(20 * time.Second):
		t.Fatal("the run's task was not claimed")
	}
	a.must(412, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("b1", "u1"), "history": []any{at("b1", "u1"), at("u1", "a1")}, "history_append": true})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": at("b1", "u1"),
		"history": []any{at("b1", "u1"), at("u1", "a1"), at("a1", "c1"), at("c1", "")}})
	if got := history(th); got != "b1 u1 a1 c1" {
		t.Fatalf("history after the whole history was sent: %q, want b1 u1 a1 c1", got)
	}
}

// An outcome sent again (its answer lost) stores its events once: the
// events of the attempt the stream holds from events_from on are taken
// as stored. One whose events were stored only in part (the runtime's
// writer stored the first of them) appends the rest.
func TestOutcomeEventsStoredOnceAcrossRetries(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.startWith(a, s.token, []any{ev("metadata", nil)})
	// The seq after the last event the runtime knows stored, as its append's answer says.
	next := int64(a.must(200, "POST", "/v1/tasks/"+s.id+"/stream/events", map[string]any{"session": s.session, "token": s.token,
		"events": []any{ev("values", 1)}}).Obj["last"].(float64)) + 1
	events := []any{ev("values", 2), ev("values", 3), ev("end", nil)}
	for i := range 3 {
		if out := s.outcomeWith(a, s.token, outcomeLock(st), events, next); out.Status != 200 || out.Obj["status"] != "success" {
			t.Fatalf("outcome %d: %d %s", i+1, out.Status, out.Raw)
		}
	}
	types, _ := streamTypes(a, s.id)
	if want := []string{"attempt_started", "metadata", "values", "values", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v after the outcome thrice, want each event once: %v", types, want)
	}

	// The first of the outcome's events already stored (by the stream route).
	p := claimedRun(t, a, false)
	pst := p.startWith(a, p.token, []any{ev("metadata", nil)})
	a.must(200, "POST", "/v1/tasks/"+p.id+"/stream/events", map[string]any{"session": p.session, "token": p.token, "events": []any{ev("values", 2)}})
	if out := p.outcomeWith(a, p.token, outcomeLock(pst), events, 3); out.Status != 200 {
		t.Fatalf("outcome: %d %s", out.Status, out.Raw)
	}
	types, _ = streamTypes(a, p.id)
	if want := []string{"attempt_started", "metadata", "values", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v, want the outcome's stored one left out: %v", types, want)
	}
}

// Events of the attempt stored from events_from on that are not the
// outcome's own are not taken for them: a write of the runtime's stored
// twice (its first sending's answer lost, the write landing after the
// second), or an events_from too early (before the start's metadata),
// leaves none of the outcome's events out.
func TestOutcomeEventsNotTakenForOthers(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.startWith(a, s.token, []any{ev("metadata", nil)})
	write := map[string]any{"session": s.session, "token": s.token, "events": []any{ev("values", 1)}}
	next := int64(a.must(200, "POST", "/v1/tasks/"+s.id+"/stream/events", write).Obj["last"].(float64)) + 1
	a.must(200, "POST", "/v1/tasks/"+s.id+"/stream/events", write) // the same write, stored late, after next
	events := []any{ev("values", 2), ev("end", nil)}
	for i := range 2 {
		if out := s.outcomeWith(a, s.token, outcomeLock(st), events, next); out.Status != 200 {
			t.Fatalf("outcome %d: %d %s", i+1, out.Status, out.Raw)
		}
	}
	types, _ := streamTypes(a, s.id)
	if want := []string{"attempt_started", "metadata", "values", "values", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v, want the outcome's values and end after the write stored twice, once: %v", types, want)
	}

	p := claimedRun(t, a, false)
	pst := p.startWith(a, p.token, []any{ev("metadata", map[string]any{"run_id": p.id})})
	if out := p.outcomeWith(a, p.token, outcomeLock(pst), []any{ev("values", map[string]any{"a": "<b>"}), ev("end", nil)}, 1); out.Status != 200 {
		t.Fatalf("outcome: %d %s", out.Status, out.Raw)
	}
	types, _ = streamTypes(a, p.id)
	if want := []string{"attempt_started", "metadata", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v after an outcome from seq 1, want its events after the metadata: %v", types, want)
	}
	// Sent again, data as the stream stores it (compacted, escaped) or not: nothing more.
	if out := p.outcomeWith(a, p.token, outcomeLock(pst), []any{ev("values", map[string]any{"a": "<b>"}), ev("end", nil)}, 1); out.Status != 200 {
		t.Fatalf("outcome again: %d %s", out.Status, out.Raw)
	}
	if types, _ = streamTypes(a, p.id); len(types) != 4 {
		t.Fatalf("stream %v after the outcome sent again, want it unchanged", types)
	}
}
