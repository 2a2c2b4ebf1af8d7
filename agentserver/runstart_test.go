package agentserver_test

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/agentserver"
)

// started is a run created and claimed as a runtime claims it: under an
// HTTP session, whose id the start takes.
type started struct {
	th, id, session string
	token           int64
}

// claimedRun makes a thread (with a head checkpoint when head is set)
// and a run of it, and claims the run's task under a session of its own.
func claimedRun(t *testing.T, a *api, head bool) started {
	t.Helper()
	th := newThread(t, a)
	if head {
		putCheckpoint(a, th, "", nil)
	}
	id := a.must(200, "POST", "/threads/"+th+"/runs", map[string]any{"assistant_id": "agent"}).Obj["run_id"].(string)
	sess := a.must(201, "POST", "/v1/sessions", map[string]any{"ttl": 30, "name": "rt"}).Obj["id"].(string)
	got := a.must(200, "POST", "/v1/queues/langgraph/claim", map[string]any{"session": sess, "wait": "10s"}).Obj["tasks"].([]any)
	if len(got) != 1 {
		a.t.Fatalf("claimed %d tasks, want the run's", len(got))
	}
	task := got[0].(map[string]any)
	if task["task_id"] != id {
		a.t.Fatalf("claimed task %v, want run %s", task["task_id"], id)
	}
	return started{th: th, id: id, session: sess, token: int64(task["token"].(float64))}
}

// putCheckpoint puts a checkpoint on thread th (fenced by fence's lock,
// session and token when given) with a pending write, and answers the
// put's status.
func putCheckpoint(a *api, th, parent string, fence map[string]any) int {
	a.t.Helper()
	body := map[string]any{"state": "c3RhdGU=", "metadata": map[string]any{"step": 1, "source": "loop"}, "mode": "append"}
	for k, v := range fence {
		body[k] = v
	}
	if parent != "" {
		body["parent_checkpoint_id"] = parent
	}
	ans := a.do("POST", "/v1/threads/"+th+"/checkpoints", body)
	if ans.Status == 201 && fence == nil {
		a.must(204, "POST", "/v1/threads/"+th+"/checkpoints/"+ans.Obj["checkpoint_id"].(string)+"/writes",
			map[string]any{"task_id": "t1", "writes": []any{map[string]any{"channel": "messages", "value": "eA=="}, map[string]any{"channel": "empty"}}})
	}
	return ans.Status
}

func (s started) start(a *api) answer {
	a.t.Helper()
	return a.do("POST", "/v1/agent-server/threads/"+s.th+"/runs/"+s.id+"/start", map[string]any{"token": s.token, "session": s.session, "wait": 5})
}

func (s started) outcome(a *api, lock any) answer {
	a.t.Helper()
	body := map[string]any{"token": s.token, "status": "success", "state": valuesState(map[string]any{"x": 1.0})}
	if lock != nil {
		body["lock"] = lock
	}
	return a.do("PUT", "/v1/agent-server/threads/"+s.th+"/runs/"+s.id+"/outcome", body)
}

// lockHolder answers the token of the thread's lock's holder, 0 when
// nobody holds it.
func lockHolder(a *api, th string) int64 {
	a.t.Helper()
	ans := a.do("GET", "/v1/locks/thread:"+th, nil)
	if ans.Status == 404 {
		return 0
	}
	if ans.Status != 200 {
		a.t.Fatalf("lock status: %d %s", ans.Status, ans.Raw)
	}
	return int64(ans.Obj["token"].(float64))
}

// outcomeLock is the lock of a start's answer as an outcome names it.
func outcomeLock(st answer) map[string]any {
	l := st.Obj["lock"].(map[string]any)
	return map[string]any{"name": l["name"], "token": l["token"], "contender": l["contender"]}
}

// The start takes the thread's lock under the session (it fences the
// run's checkpoint writes as a lock taken through /v1/locks does), and
// answers the thread's head exactly as GET /v1/threads/{id}/head does.
func TestRunStartTakesTheLockAndAnswersTheHead(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, true)
	st := s.start(a)
	if st.Status != 200 || st.Obj["cancelled"] != nil {
		t.Fatalf("start: %d %s", st.Status, st.Raw)
	}
	l := st.Obj["lock"].(map[string]any)
	token := int64(l["token"].(float64))
	if l["name"] != "thread:"+s.th || l["session"] != s.session || l["contender"] == "" || l["status"] != "acquired" {
		t.Fatalf("lock %v: want thread:%s under the session, with its contender", l, s.th)
	}
	if got := lockHolder(a, s.th); got != token {
		t.Fatalf("lock held with token %d, want the start's %d", got, token)
	}
	head := a.must(200, "GET", "/v1/threads/"+s.th+"/head", nil).Obj
	if !reflect.DeepEqual(st.Obj["head"], head) {
		t.Fatalf("start's head\n%v\nwant the head route's\n%v", st.Obj["head"], head)
	}
	if w := head["pending_writes"].([]any); len(w) != 2 {
		t.Fatalf("head's pending writes %v: want the two put", w)
	}
	fence := map[string]any{"lock": l["name"], "session": s.session, "token": token}
	if got := putCheckpoint(a, s.th, head["checkpoint_id"].(string), fence); got != 201 {
		t.Fatalf("fenced put under the start's lock: %d, want 201", got)
	}
	// Another taking the lock (as a stop does) fences the run's writes.
	a.must(204, "DELETE", fmt.Sprintf("/v1/locks/thread:%s?token=%d&contender=%s&session=%s", s.th, token, l["contender"], s.session), nil)
	other := a.must(201, "POST", "/v1/sessions", map[string]any{"ttl": 30}).Obj["id"].(string)
	a.must(200, "POST", "/v1/locks/thread:"+s.th, map[string]any{"session": other})
	if got := putCheckpoint(a, s.th, "", fence); got != 409 {
		t.Fatalf("fenced put under a lost lock: %d, want 409", got)
	}
}

// A thread without checkpoints has a null head.
func TestRunStartAnswersANullHead(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.start(a)
	if st.Status != 200 || st.Obj["head"] != nil || st.Obj["lock"] == nil {
		t.Fatalf("start: %d %s: want a lock and a null head", st.Status, st.Raw)
	}
	if _, ok := st.Obj["head"]; !ok {
		t.Fatalf("start %s: want head: null", st.Raw)
	}
}

// A runtime that does not hold the run's task under its token is refused
// (409), and the lock the start took goes again.
func TestRunStartRefusesAnotherToken(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	s.token++
	if st := s.start(a); st.Status != 409 {
		t.Fatalf("start under another token: %d %s, want 409", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after a refused start: want it let go", got)
	}
	s.token--
	if st := s.start(a); st.Status != 200 {
		t.Fatalf("start under the claim's token: %d %s", st.Status, st.Raw)
	}
}

// A run cancelled after its claim, before its start, starts as cancelled:
// no lock is held, and the runtime runs nothing.
func TestRunStartAnswersACancelledRun(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, true)
	a.must(204, "POST", "/threads/"+s.th+"/runs/"+s.id+"/cancel", nil)
	st := s.start(a)
	if st.Status != 200 || st.Obj["cancelled"] != true || st.Obj["lock"] != nil {
		t.Fatalf("start of a cancelled run: %d %s, want cancelled without a lock", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after a cancelled start", got)
	}
}

// A stop that comes during the start, before its lock is taken, makes the
// start answer cancelled (the claim is read after the lock); one that
// comes after the start took the lock from the run: its writes are
// refused, and so is its outcome.
func TestRunStartSeesAStopRacingIt(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, true)
	var once sync.Once
	cancelled := 0
	restore := agentserver.SetBeforeRunLock(func() {
		once.Do(func() { cancelled = a.do("POST", "/threads/"+s.th+"/runs/"+s.id+"/cancel", nil).Status })
	})
	st := s.start(a)
	restore()
	if cancelled != 204 {
		t.Fatalf("the stop during the start answered %d, want 204", cancelled)
	}
	if st.Status != 200 || st.Obj["cancelled"] != true {
		t.Fatalf("start with a stop before its lock: %d %s, want cancelled", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after the stop", got)
	}

	s = claimedRun(t, a, true)
	st = s.start(a)
	if st.Status != 200 || st.Obj["lock"] == nil {
		t.Fatalf("start: %d %s", st.Status, st.Raw)
	}
	a.must(204, "POST", "/threads/"+s.th+"/runs/"+s.id+"/cancel", nil)
	l := st.Obj["lock"].(map[string]any)
	fence := map[string]any{"lock": l["name"], "session": s.session, "token": l["token"]}
	if got := putCheckpoint(a, s.th, "", fence); got != 409 {
		t.Fatalf("the stopped run's fenced put: %d, want 409", got)
	}
	if ans := s.outcome(a, outcomeLock(st)); ans.Status != 409 {
		t.Fatalf("the stopped run's outcome: %d %s, want 409", ans.Status, ans.Raw)
	}
}

// A stop between the start's read of the claim and its append of the
// run's first events fences the append: the start answers cancelled, as
// for a stop before it, holds no lock, and stored none of its events.
func TestRunStartStoppedBeforeItsAppendIsCancelled(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, true)
	var once sync.Once
	cancelled := 0
	restore := agentserver.SetAfterRunClaim(func() {
		once.Do(func() { cancelled = a.do("POST", "/threads/"+s.th+"/runs/"+s.id+"/cancel", nil).Status })
	})
	st := s.startWith(a, s.token, []any{ev("metadata", nil)})
	restore()
	if cancelled != 204 {
		t.Fatalf("the stop during the start answered %d, want 204", cancelled)
	}
	if st.Status != 200 || st.Obj["cancelled"] != true {
		t.Fatalf("start with a stop before its append: %d %s, want cancelled", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after the stop", got)
	}
	if types, _ := streamTypes(a, s.id); slices.Contains(types, "metadata") {
		t.Fatalf("stream %v: the stopped start's metadata was stored", types)
	}
}

// The outcome releases the lock the start took, in its transaction.
func TestOutcomeReleasesTheRunLock(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.start(a)
	if ans := s.outcome(a, outcomeLock(st)); ans.Status != 200 || ans.Obj["status"] != "success" {
		t.Fatalf("outcome: %d %s", ans.Status, ans.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after the outcome: want it released", got)
	}
}

// A lock lost before the outcome (taken by a stop, or by another since)
// does not fail the outcome, and a later holder keeps it.
func TestOutcomeLeavesALaterHolderAlone(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.start(a)
	l := st.Obj["lock"].(map[string]any)
	a.must(204, "DELETE", fmt.Sprintf("/v1/locks/thread:%s?token=%v&contender=%s&session=%s", s.th, l["token"], l["contender"], s.session), nil)
	other := a.must(201, "POST", "/v1/sessions", map[string]any{"ttl": 30}).Obj["id"].(string)
	later := int64(a.must(200, "POST", "/v1/locks/thread:"+s.th, map[string]any{"session": other}).Obj["token"].(float64))
	if ans := s.outcome(a, outcomeLock(st)); ans.Status != 200 || ans.Obj["status"] != "success" {
		t.Fatalf("outcome with a lost lock: %d %s, want it recorded", ans.Status, ans.Raw)
	}
	if got := lockHolder(a, s.th); got != later {
		t.Fatalf("lock held with token %d after the outcome, want the later holder's %d", got, later)
	}
	if th := a.must(200, "GET", "/threads/"+s.th, nil).Obj; th["status"] != "idle" {
		t.Fatalf("thread %v after the outcome: want idle", th["status"])
	}
}

// An outcome sent again (its first answer lost) releases the lock too: a
// first outcome that did not take it along, then one that does.
func TestRepeatOutcomeReleasesTheRunLock(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.start(a)
	a.must(200, "PUT", "/v1/agent-server/threads/"+s.th+"/runs/"+s.id+"/outcome", map[string]any{"token": s.token, "status": "success"})
	if got := lockHolder(a, s.th); got == 0 {
		t.Fatal("lock released by an outcome that did not name it")
	}
	if ans := s.outcome(a, outcomeLock(st)); ans.Status != 200 {
		t.Fatalf("repeat outcome: %d %s", ans.Status, ans.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after the repeat outcome: want it released", got)
	}
}

// An outcome's lock must be the run's thread's: another lock is a 400,
// and nothing is recorded.
func TestOutcomeRefusesAnotherLock(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.start(a)
	l := outcomeLock(st)
	l["name"] = "thread:other"
	if ans := s.outcome(a, l); ans.Status != 400 {
		t.Fatalf("outcome naming another lock: %d %s, want 400", ans.Status, ans.Raw)
	}
	if r := a.must(200, "GET", "/threads/"+s.th+"/runs/"+s.id, nil).Obj; r["status"] != "running" {
		t.Fatalf("run %v after a refused outcome: want running", r["status"])
	}
	raw, _ := json.Marshal(outcomeLock(st))
	if ans := s.outcome(a, json.RawMessage(raw)); ans.Status != 200 {
		t.Fatalf("outcome: %d %s", ans.Status, ans.Raw)
	}
}

// A stop that comes while the start waits in line for the thread's lock
// (another holds it) takes the start's place in line too: the start
// answers cancelled, without a lock, and nobody holds the lock after.
func TestRunStartWaitingSeesAStop(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	other := a.must(201, "POST", "/v1/sessions", map[string]any{"ttl": 30}).Obj["id"].(string)
	a.must(200, "POST", "/v1/locks/thread:"+s.th, map[string]any{"session": other})
	done := make(chan answer, 1)
	go func() { done <- s.start(a) }()
	for i := 0; ; i++ {
		if st := a.must(200, "GET", "/v1/locks/thread:"+s.th, nil).Obj; st["waiters"].(float64) == 1 {
			break
		}
		if i == 500 {
			t.Fatal("the start never waited in line for the thread's lock")
		}
		time.Sleep(10 * time.Millisecond)
	}
	a.must(204, "POST", "/threads/"+s.th+"/runs/"+s.id+"/cancel", nil)
	st := <-done
	if st.Status != 200 || st.Obj["cancelled"] != true || st.Obj["lock"] != nil {
		t.Fatalf("start stopped while it waited: %d %s, want cancelled without a lock", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after the stop", got)
	}
}

// streamTypes answers the types of the events task id's stream holds, in
// order, drover's own among them, and the seq after the last.
func streamTypes(a *api, id string) ([]string, int64) {
	a.t.Helper()
	p := a.must(200, "GET", "/v1/tasks/"+id+"/stream", nil).Obj
	var types []string
	for _, e := range p["events"].([]any) {
		types = append(types, e.(map[string]any)["type"].(string))
	}
	return types, int64(p["next"].(float64))
}

func (s started) startWith(a *api, token int64, events []any) answer {
	a.t.Helper()
	return a.do("POST", "/v1/agent-server/threads/"+s.th+"/runs/"+s.id+"/start", map[string]any{"token": token, "session": s.session, "wait": 5, "events": events})
}

func (s started) outcomeWith(a *api, token int64, lock any, events []any, from int64) answer {
	a.t.Helper()
	body := map[string]any{"token": token, "status": "success", "state": valuesState(map[string]any{"x": 1.0}), "events": events, "events_from": from}
	if lock != nil {
		body["lock"] = lock
	}
	return a.do("PUT", "/v1/agent-server/threads/"+s.th+"/runs/"+s.id+"/outcome", body)
}

func ev(typ string, data any) map[string]any { return map[string]any{"type": typ, "data": data} }

// A start's events go to the run task's stream under the claim, after
// the attempt's opening, and the answer says their seqs; an outcome's
// events follow the events written between, in order, before the run
// ends.
func TestRunStartAndOutcomeAppendTheRunsEvents(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	st := s.startWith(a, s.token, []any{ev("metadata", map[string]any{"run_id": s.id}), ev("log", "first")})
	if st.Status != 200 || st.Obj["lock"] == nil {
		t.Fatalf("start: %d %s", st.Status, st.Raw)
	}
	if got := st.Obj["events"]; !reflect.DeepEqual(got, map[string]any{"first": 2.0, "last": 3.0}) {
		t.Fatalf("start answered events %v, want first 2, last 3 (after attempt_started)", got)
	}
	a.must(200, "POST", "/v1/tasks/"+s.id+"/stream/events", map[string]any{"session": s.session, "token": s.token, "events": []any{ev("values", 1)}})
	out := s.outcomeWith(a, s.token, outcomeLock(st), []any{ev("values", 2), ev("end", nil)}, 5)
	if out.Status != 200 || out.Obj["status"] != "success" {
		t.Fatalf("outcome: %d %s", out.Status, out.Raw)
	}
	types, _ := streamTypes(a, s.id)
	if want := []string{"attempt_started", "metadata", "log", "values", "values", "end"}; !reflect.DeepEqual(types, want) {
		t.Fatalf("stream %v, want %v", types, want)
	}
}

// Events with a token that no longer holds the run's task are not
// stored, by the start or by the outcome: both are refused.
func TestRunEventsUnderAStaleTokenAreRefused(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	if st := s.startWith(a, s.token+1, []any{ev("metadata", nil)}); st.Status != 409 {
		t.Fatalf("start under another token: %d %s, want 409", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after a refused start", got)
	}
	st := s.startWith(a, s.token, nil)
	if out := s.outcomeWith(a, s.token+1, outcomeLock(st), []any{ev("values", 1)}, 1); out.Status != 409 {
		t.Fatalf("outcome under another token: %d %s, want 409", out.Status, out.Raw)
	}
	if types, _ := streamTypes(a, s.id); len(types) != 0 {
		t.Fatalf("stream %v after refused writes, want none", types)
	}
}

// A start or an outcome with a bad event is refused naming the event's
// field, before anything is written: no lock taken, no event stored.
func TestRunEventsBadAreRefused(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	bad := []any{ev("metadata", nil), ev("log", 1), ev("done", nil)}
	st := s.startWith(a, s.token, bad)
	if st.Status != 400 || !strings.Contains(st.Raw, "body.events[2].type") {
		t.Fatalf("start with a drover event: %d %s, want 400 naming body.events[2].type", st.Status, st.Raw)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after a refused start", got)
	}
	if st := s.startWith(a, s.token, []any{ev("", nil)}); st.Status != 400 || !strings.Contains(st.Raw, "body.events[0].type") {
		t.Fatalf("start with an empty type: %d %s, want 400 naming body.events[0].type", st.Status, st.Raw)
	}
	ok := s.startWith(a, s.token, nil)
	if out := s.outcomeWith(a, s.token, outcomeLock(ok), bad, 1); out.Status != 400 || !strings.Contains(out.Raw, "body.events[2].type") {
		t.Fatalf("outcome with a drover event: %d %s, want 400 naming body.events[2].type", out.Status, out.Raw)
	}
	if out := s.outcomeWith(a, s.token, outcomeLock(ok), []any{ev("log", 1)}, 0); out.Status != 400 || !strings.Contains(out.Raw, "body.events_from") {
		t.Fatalf("outcome with events and no events_from: %d %s, want 400 naming body.events_from", out.Status, out.Raw)
	}
	if types, _ := streamTypes(a, s.id); len(types) != 0 {
		t.Fatalf("stream %v after refused writes, want none", types)
	}
	if r := a.must(200, "GET", "/threads/"+s.th+"/runs/"+s.id, nil).Obj; r["status"] != "running" {
		t.Fatalf("run %v after refused outcomes, want running", r["status"])
	}
}

// A start whose events are over one write's limit together (each under
// its own) is refused before it takes the thread's lock: 413 naming the
// limit, the lock never asked for, and the run then starts as usual.
func TestRunStartRefusesTooManyEventBytesBeforeTheLock(t *testing.T) {
	a := newAPI(t)
	s := claimedRun(t, a, false)
	locks := 0
	defer agentserver.SetBeforeRunLock(func() { locks++ })()
	big := strings.Repeat("x", 60<<10)
	var events []any
	for range 14 { // 14 × 60 KiB: over 768 KiB in all
		events = append(events, ev("custom", big))
	}
	st := s.startWith(a, s.token, events)
	if st.Status != 413 || !strings.Contains(string(st.Raw), "smaller parts") {
		t.Fatalf("start with %d KiB of events: %d %s, want 413 naming the limit", 14*60, st.Status, st.Raw)
	}
	if locks != 0 {
		t.Fatalf("the refused start asked for the lock %d times, want none", locks)
	}
	if got := lockHolder(a, s.th); got != 0 {
		t.Fatalf("lock held with token %d after a refused start, want it free", got)
	}
	if st := s.startWith(a, s.token, events[:2]); st.Status != 200 || st.Obj["lock"] == nil {
		t.Fatalf("start after the refusal: %d %s, want the lock", st.Status, st.Raw)
	}
}
