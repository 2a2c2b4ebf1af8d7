package agentserver_test

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// startRun makes a thread and a run of it, claims the run's task as a
// runtime would, and answers the thread, the run's outcome path and the
// claim's token.
func startRun(t testing.TB, a *api, body map[string]any) (th, out string, token int64) {
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

// cpState is a state at checkpoint cp, with a few messages as values.
func cpState(cp string) map[string]any {
	msgs := make([]any, 8)
	for i := range msgs {
		msgs[i] = map[string]any{"type": "ai", "content": fmt.Sprintf("message %d of %s, with some words in it", i, cp)}
	}
	s := valuesState(map[string]any{"cp": cp, "messages": msgs})
	s["checkpoint"] = map[string]any{"checkpoint_id": cp}
	s["metadata"] = map[string]any{"step": cp}
	return s
}

// cpStates is cpState of each of cps.
func cpStates(cps ...string) []any {
	out := make([]any, len(cps))
	for i, cp := range cps {
		out[i] = cpState(cp)
	}
	return out
}

// historyIDs is the checkpoint ids of thread th's history, newest first.
func historyIDs(a *api, th string) string {
	var ids []string
	for _, st := range a.must(200, "POST", "/threads/"+th+"/history", map[string]any{"limit": 1000}).List {
		ids = append(ids, st["checkpoint"].(map[string]any)["checkpoint_id"].(string))
	}
	return strings.Join(ids, " ")
}

// nextRun makes a run of thread th, claims it, and answers its outcome's
// path and the claim's token.
func nextRun(t testing.TB, a *api, th string) (string, int64) {
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	return "/v1/agent-server/threads/" + th + "/runs/" + id + "/outcome", claimRun(t, a)
}

// historyKeys counts thread th's history keys.
func historyKeys(t testing.TB, a *api, th string) int64 {
	resp, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).AgentThreadHistory(th), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

// cps is checkpoint ids "c{hi}" down to "c{lo}".
func cps(hi, lo int) []string {
	var out []string
	for i := hi; i >= lo; i-- {
		out = append(out, fmt.Sprintf("c%03d", i))
	}
	return out
}

// A history grown over many appending outcomes keeps its newest 100
// states, newest first, one key each; the state record holds no history.
func TestLongHistoryKeepsTheNewest100(t *testing.T) {
	a := newAPI(t)
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c000"), "history": cpStates("c000")})
	for hi := 5; hi <= 150; hi += 5 {
		out, token := nextRun(t, a, th)
		a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState(cps(hi, hi)[0]),
			"history": cpStates(cps(hi, hi-5)...), "history_append": true})
	}
	if got, want := historyIDs(a, th), strings.Join(cps(150, 51), " "); got != want {
		t.Fatalf("history after 151 states:\n%s\nwant the newest 100:\n%s", got, want)
	}
	if n := historyKeys(t, a, th); n != 100 {
		t.Fatalf("%d history keys: want 100", n)
	}
	if h := a.must(200, "GET", "/threads/"+th+"/history?limit=3", nil).List; len(h) != 3 || h[0]["metadata"].(map[string]any)["step"] != "c150" {
		t.Fatalf("history with limit 3: %d states, the first %v: want c150 c149 c148", len(h), h[0]["metadata"])
	}
	rec, err := a.cli.Get(context.Background(), keyspace.MustNew(a.ns).AgentThreadState(th))
	if err != nil || len(rec.Kvs) != 1 || strings.Contains(string(rec.Kvs[0].Value), `"history"`) || !strings.Contains(string(rec.Kvs[0].Value), "c150") {
		t.Fatalf("state record %q (%v): want the state c150 alone", rec.Kvs, err)
	}
	out, token = nextRun(t, a, th)
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c151"), "history": cpStates("c151", "c150"),
		"history_append": true, "history_limit": 3})
	if got := historyIDs(a, th); got != "c151 c150 c149" {
		t.Fatalf("history after an outcome with history_limit 3: %q", got)
	}
}

// An appended history joins the stored state its last state names, also
// one older than the newest (a run started from an older checkpoint): the
// stored states newer than it are left out. One whose last state is not
// stored, or has no checkpoint id, is refused (412) and changes nothing.
func TestAppendJoinsAnOlderStoredState(t *testing.T) {
	a := newAPI(t)
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c4"), "history": cpStates("c4", "c3", "c2", "c1")})
	out, token = nextRun(t, a, th)
	a.must(412, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("x2"), "history": cpStates("x2", "x1"), "history_append": true})
	anon := cpState("x1")
	delete(anon, "checkpoint")
	a.must(412, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("x2"), "history": []any{cpState("x2"), anon}, "history_append": true})
	if got := historyIDs(a, th); got != "c4 c3 c2 c1" {
		t.Fatalf("history after refused appends: %q, want it unchanged", got)
	}
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("b2"), "history": cpStates("b2", "b1", "c2"), "history_append": true})
	if got := historyIDs(a, th); got != "b2 b1 c2 c1" {
		t.Fatalf("history after an append on c2: %q, want b2 b1 c2 c1", got)
	}
	if n := historyKeys(t, a, th); n != 4 {
		t.Fatalf("%d history keys: want 4", n)
	}
}

// A thread stored by the previous layout, its history in its state record,
// reads as it did; an outcome appends to that history and converts it to
// one key per state; a record of it with a gap refuses an append (412).
func TestHistoryOfThePreviousLayout(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	sp := keyspace.MustNew(a.ns)
	th, out, token := startRun(t, a, map[string]any{})
	legacy := func(gap bool) {
		raw, _ := json.Marshal(map[string]any{"state": cpState("c3"), "history": cpStates("c3", "c2", "c1"), "gap": gap})
		if _, err := a.cli.Put(ctx, sp.AgentThreadState(th), string(raw)); err != nil {
			t.Fatal(err)
		}
	}
	legacy(true)
	if got := historyIDs(a, th); got != "c3 c2 c1" {
		t.Fatalf("history of a record of the previous layout: %q, want c3 c2 c1", got)
	}
	if st := a.must(200, "GET", "/threads/"+th+"/state/c2", nil).Obj; st["metadata"].(map[string]any)["step"] != "c2" {
		t.Fatalf("state at c2 of the previous layout: %v", st["metadata"])
	}
	a.must(412, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c4"), "history": cpStates("c4", "c3"), "history_append": true})
	legacy(false)
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c4"), "history": cpStates("c4", "c3"), "history_append": true})
	if got := historyIDs(a, th); got != "c4 c3 c2 c1" {
		t.Fatalf("history appended to the previous layout's: %q, want c4 c3 c2 c1", got)
	}
	rec, err := a.cli.Get(ctx, sp.AgentThreadState(th))
	if err != nil || len(rec.Kvs) != 1 || strings.Contains(string(rec.Kvs[0].Value), `"history"`) {
		t.Fatalf("state record after the outcome %q (%v): want it converted, without history", rec.Kvs, err)
	}
	if n := historyKeys(t, a, th); n != 4 {
		t.Fatalf("%d history keys after the conversion: want 4", n)
	}
}

// A copy copies a thread's history keys (the copy's thread id in them), a
// keep_latest prune keeps its newest state's key alone, a delete deletes
// them all; the same of a thread of the previous layout.
func TestCopyPruneDeleteHistoryKeys(t *testing.T) {
	a := newAPI(t)
	ctx := context.Background()
	sp := keyspace.MustNew(a.ns)
	th, out, token := startRun(t, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c5"), "history": cpStates(strings.Fields("c5 c4 c3 c2 c1")...)})
	other := a.must(200, "POST", "/threads", map[string]any{}).Obj["thread_id"].(string)
	raw, _ := json.Marshal(map[string]any{"state": cpState("o3"), "history": cpStates("o3", "o2", "o1")})
	if _, err := a.cli.Put(ctx, sp.AgentThreadState(other), string(raw)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ th, want string }{{th, "c5 c4 c3 c2 c1"}, {other, "o3 o2 o1"}} {
		cp := a.must(200, "POST", "/threads/"+c.th+"/copy", nil).Obj["thread_id"].(string)
		if got := historyIDs(a, cp); got != c.want {
			t.Fatalf("copy's history %q: want %q", got, c.want)
		}
		if n := historyKeys(t, a, cp); n != int64(len(strings.Fields(c.want))) {
			t.Fatalf("copy of %s has %d history keys: want one per state", c.th, n)
		}
		h := a.must(200, "POST", "/threads/"+cp+"/history", map[string]any{"limit": 1}).List
		if h[0]["checkpoint"].(map[string]any)["thread_id"] != cp || h[0]["metadata"].(map[string]any)["thread_id"] != cp {
			t.Fatalf("copy's newest state %v %v: want the copy's thread id", h[0]["checkpoint"], h[0]["metadata"])
		}
		a.must(200, "POST", "/threads/prune", map[string]any{"thread_ids": []any{c.th}, "strategy": "keep_latest"})
		if got, n := historyIDs(a, c.th), historyKeys(t, a, c.th); got != strings.Fields(c.want)[0] || n != 1 {
			t.Fatalf("history after keep_latest %q, %d keys: want the newest alone", got, n)
		}
		a.must(204, "DELETE", "/threads/"+cp, nil)
		if n := historyKeys(t, a, cp); n != 0 {
			t.Fatalf("%d history keys of a deleted thread: want none", n)
		}
	}
}

// BenchmarkOutcomeOnALongHistory: the outcome of a run that adds two
// states to a thread whose history holds 90 states at first (then 100, its
// limit), as a runtime sends it (history_append). The run's creation and
// claim are not timed.
func BenchmarkOutcomeOnALongHistory(b *testing.B) {
	a := newAPI(b)
	th, out, token := startRun(b, a, map[string]any{})
	a.must(200, "PUT", out, map[string]any{"token": token, "status": "success", "state": cpState("c089"), "history": cpStates(cps(89, 0)...)})
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		out, token := nextRun(b, a, th)
		hi := 91 + 2*i
		body := map[string]any{"token": token, "status": "success", "state": cpState(cps(hi, hi)[0]), "history": cpStates(cps(hi, hi-2)...), "history_append": true}
		b.StartTimer()
		a.must(200, "PUT", out, body)
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

// Two sendings of one outcome at once (a retry while the first is still
// under way) store its events once: the second, sent between the
// first's read of the stream and its append, appends them and ends the
// run; the first then finds the stream moved, reads it again, finds its
// events there and appends nothing.
func TestOutcomeSentTwiceAtOnceStoresItsEventsOnce(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.startWith(a, s.token, []any{ev("metadata", nil)})
	events := []any{ev("values", 1), ev("values", 2), ev("end", nil)}
	var mu sync.Mutex // the hook runs on the server's goroutines
	var inner *answer
	nested := false
	defer agentserver.SetAfterOutcomeRead(func(task string) {
		mu.Lock()
		first := task == s.id && !nested
		nested = nested || first
		mu.Unlock()
		if !first {
			return
		}
		r := s.outcomeWith(a, s.token, outcomeLock(st), events, 3)
		mu.Lock()
		inner = &r
		mu.Unlock()
	})()
	if out := s.outcomeWith(a, s.token, outcomeLock(st), events, 3); out.Status != 200 || out.Obj["status"] != "success" {
		t.Fatalf("first outcome: %d %s", out.Status, out.Raw)
	}
	mu.Lock()
	defer mu.Unlock()
	if inner == nil || inner.Status != 200 {
		t.Fatalf("the second sending, under way inside the first: %+v", inner)
	}
	types, _ := streamTypes(a, s.id)
	if want := []string{"attempt_started", "metadata", "values", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v after two sendings at once, want each event once: %v", types, want)
	}
}

// A run started on one member whose runtime's events went through
// another: the outcome sent to the first member appends its events after
// them, though that member's writer last saw the stream before them.
func TestOutcomeAfterEventsWrittenThroughAnotherMember(t *testing.T) {
	a := newAPI(t)
	b := newAPI(t, func(cfg *httpapi.Config) { cfg.Namespace = a.ns })
	s := claimedRun(t, a, false)
	st := s.startWith(a, s.token, []any{ev("metadata", nil)})
	if st.Status != 200 {
		t.Fatalf("start: %d %s", st.Status, st.Raw)
	}
	b.must(200, "POST", "/v1/tasks/"+s.id+"/stream/events", map[string]any{"session": s.session, "token": s.token, "events": []any{ev("values", 1)}})
	out := s.outcomeWith(a, s.token, outcomeLock(st), []any{ev("values", 2), ev("end", nil)}, 4)
	if out.Status != 200 || out.Obj["status"] != "success" {
		t.Fatalf("outcome on the member that started the run: %d %s", out.Status, out.Raw)
	}
	types, _ := streamTypes(a, s.id)
	if want := []string{"attempt_started", "metadata", "values", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v, want %v", types, want)
	}
}
