package httpapi_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/task"
)

// waitOutcome reports wait_signal for task tk under sess and returns its
// result.
func (a *api) waitOutcome(q, sess string, tk map[string]any, wait map[string]any) map[string]any {
	a.t.Helper()
	r := a.do("POST", "/v1/queues/"+q+"/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": tk["task_id"], "token": tk["token"], "wait_signal": wait}}}).want(a.t, 200)
	return r.JSON["results"].([]any)[0].(map[string]any)
}

// A plain task claimed over HTTP ends its attempt with a wait for a
// signal: with none sent it parks WAITING (no claim), a signal wakes it,
// and the claim that follows shows the wait; reporting it again is
// answered with the signal, not consumed, the claim held on. A signal
// sent before the wait is answered at once, and again when the wait is
// reported again (an answer lost); the outcome that names it in
// received_signals consumes it, and a stale token's outcome naming it
// gets 409 and consumes nothing; a wait past its until answers its
// timeout.
func TestPlainTaskWaitsForASignal(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/pw/tasks", qtasksJSON("w", 3)).want(t, 200)
	sess := a.session(30)
	byID := map[string]map[string]any{}
	for _, tk := range a.qclaim("pw", sess, 3, "5s") {
		byID[tk["task_id"].(string)] = tk
	}
	if len(byID) != 3 {
		t.Fatalf("claimed %d tasks, want 3", len(byID))
	}
	// Sent before w-1 waits: kept, and answered at once.
	a.do("POST", "/v1/tasks/w-1/signals/go", map[string]any{"data": map[string]any{"ok": 1}, "idempotency_key": "k1"}).want(t, 202)
	// A stale token consumes nothing.
	stale := map[string]any{"task_id": "w-1", "token": byID["w-1"]["token"].(float64) + 1000}
	if r := a.waitOutcome("pw", sess, stale, map[string]any{"names": []string{"go"}}); r["status"].(float64) != 409 {
		t.Fatalf("a stale token's wait: %v; want 409", r)
	}
	r := a.waitOutcome("pw", sess, byID["w-1"], map[string]any{"names": []string{"go", "other"}, "timeout": "1h"})
	sg, _ := r["signal"].(map[string]any)
	if r["status"].(float64) != 200 || r["current_status"] != "RUNNING" || sg == nil || sg["name"] != "go" || sg["idempotency_key"] != "k1" {
		t.Fatalf("a wait for a signal sent before it: %v; want RUNNING with signal go", r)
	}
	consumed := func(want bool) {
		t.Helper()
		sigs := a.do("GET", "/v1/queues/pw/tasks/w-1", nil).want(t, 200)
		if list := sigs.JSON["signals"].([]any); len(list) != 1 || list[0].(map[string]any)["consumed"] != want {
			t.Fatalf("w-1's signals: %v; want one, consumed %v", sigs.JSON["signals"], want)
		}
	}
	// Not consumed by the answer: the same wait again (its answer lost)
	// is answered the same signal.
	consumed(false)
	r = a.waitOutcome("pw", sess, byID["w-1"], map[string]any{"names": []string{"go"}, "timeout": "1h"})
	if sg, _ := r["signal"].(map[string]any); r["status"].(float64) != 200 || sg == nil || sg["idempotency_key"] != "k1" {
		t.Fatalf("the wait reported again: %v; want signal go k1 again", r)
	}
	got := []any{map[string]any{"name": "go", "idempotency_key": "k1"}}
	// A stale claim's outcome naming it consumes nothing.
	if r := a.do("POST", "/v1/queues/pw/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "w-1", "token": stale["token"], "ok": true, "received_signals": got}}}).want(t, 200); r.JSON["results"].([]any)[0].(map[string]any)["status"].(float64) != 409 {
		t.Fatalf("a stale claim's success: %v; want 409", r.JSON)
	}
	consumed(false)
	// The success that names it consumes it.
	a.do("POST", "/v1/queues/pw/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "w-1", "token": byID["w-1"]["token"], "ok": true, "received_signals": got}}}).want(t, 200)
	consumed(true)
	if got := a.do("GET", "/v1/queues/pw/tasks/w-1", nil).want(t, 200); got.JSON["current_status"] != "SUCCEEDED" {
		t.Fatalf("w-1 after its success: %v", got.JSON["current_status"])
	}
	a.do("POST", "/v1/queues/pw/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "w-2", "token": byID["w-2"]["token"], "ok": true, "received_signals": []any{map[string]any{"name": "bad name", "idempotency_key": "k"}}}}}).want(t, 400)

	// No signal yet: w-0 parks.
	r = a.waitOutcome("pw", sess, byID["w-0"], map[string]any{"names": []string{"go"}, "timeout": "1h"})
	if r["status"].(float64) != 200 || r["current_status"] != "WAITING" || r["signal"] != nil || r["scheduled_at"] == nil {
		t.Fatalf("a wait with no signal: %v; want WAITING until its timeout", r)
	}
	if got := a.do("GET", "/v1/queues/pw/tasks/w-0", nil).want(t, 200); got.JSON["current_status"] != "WAITING" {
		t.Fatalf("w-0 after its wait: %v", got.JSON["current_status"])
	}
	woke := a.do("POST", "/v1/tasks/w-0/signals/go", map[string]any{"data": "yes"}).want(t, 202)
	if woke.JSON["woke"] != true {
		t.Fatalf("the signal to the waiting w-0: %v; want woke", woke.JSON)
	}
	again := a.qclaim("pw", sess, 1, "5s")
	if len(again) != 1 || again[0]["task_id"] != "w-0" {
		t.Fatalf("claimed %v after the signal; want w-0", again)
	}
	wf, _ := again[0]["waiting_for"].(map[string]any)
	if wf == nil || wf["until"] == nil {
		t.Fatalf("the claim of the woken w-0 shows no wait: %v", again[0])
	}
	r = a.waitOutcome("pw", sess, again[0], map[string]any{"names": []string{"go"}, "until": wf["until"]})
	if sg, _ := r["signal"].(map[string]any); r["current_status"] != "RUNNING" || sg == nil || sg["data"] != "yes" {
		t.Fatalf("the woken w-0's wait: %v; want the signal", r)
	}

	// A wait whose until passed answers its timeout, the claim held.
	past := time.Now().Add(-time.Minute).UTC().Format(time.RFC3339)
	r = a.waitOutcome("pw", sess, byID["w-2"], map[string]any{"names": []string{"go"}, "until": past})
	if sg, _ := r["signal"].(map[string]any); r["current_status"] != "RUNNING" || sg == nil || sg["timed_out"] != true {
		t.Fatalf("a wait past its until: %v; want timed_out", r)
	}
	// Bad input: named, nothing written.
	bad := a.do("POST", "/v1/queues/pw/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "w-2", "token": byID["w-2"]["token"], "ok": true, "wait_signal": map[string]any{"names": []string{"go"}}}}}).want(t, 400)
	if !strings.Contains(string(bad.Raw), "outcomes[0].wait_signal") {
		t.Fatalf("a wait with ok: %s", bad.Raw)
	}
	a.do("POST", "/v1/queues/pw/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "w-2", "token": byID["w-2"]["token"], "wait_signal": map[string]any{"names": []string{"bad name"}}}}}).want(t, 400)
	if got := a.do("GET", "/v1/queues/pw/tasks/w-2", nil).want(t, 200); got.JSON["current_status"] != "RUNNING" {
		t.Fatalf("w-2 after bad input: %v; want RUNNING still", got.JSON["current_status"])
	}
}

// A wait's until (or timeout) more than task.MaxSleepYears ahead is bad
// input naming it; nothing is written, the claim holds.
func TestPlainTaskWaitUntilBounded(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/pwb/tasks", qtasksJSON("b", 1)).want(t, 200)
	sess := a.session(30)
	tk := a.qclaim("pwb", sess, 1, "5s")[0]
	far := time.Now().AddDate(task.MaxSleepYears+1, 0, 0).UTC().Format(time.RFC3339)
	for field, wait := range map[string]map[string]any{
		"outcomes[0].wait_signal.until":   {"names": []string{"go"}, "until": far},
		"outcomes[0].wait_signal.timeout": {"names": []string{"go"}, "timeout": fmt.Sprintf("%dh", (task.MaxSleepYears+1)*366*24)},
	} {
		bad := a.do("POST", "/v1/queues/pwb/outcomes", map[string]any{"session": sess, "outcomes": []any{
			map[string]any{"task_id": tk["task_id"], "token": tk["token"], "wait_signal": wait}}}).want(t, 400)
		if !strings.Contains(string(bad.Raw), field) || !strings.Contains(string(bad.Raw), "years from now") {
			t.Fatalf("a wait too far ahead: %s; want it to name %s", bad.Raw, field)
		}
	}
	if got := a.do("GET", "/v1/queues/pwb/tasks/b-0", nil).want(t, 200); got.JSON["current_status"] != "RUNNING" {
		t.Fatalf("b-0 after bad input: %v; want RUNNING still", got.JSON["current_status"])
	}
}

// One outcome names at most 64 received signals: 65 is a 400 naming
// received_signals, nothing consumed, the claim held; 64 are consumed
// by one success. A failure to the dead-letter queue naming them
// consumes nothing (a requeue starts the handler over).
func TestPlainTaskReceivedSignalsCap(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/pwc/tasks", qtasksJSON("c", 2)).want(t, 200)
	sess := a.session(30)
	byID := map[string]map[string]any{}
	for _, tk := range a.qclaim("pwc", sess, 2, "5s") {
		byID[tk["task_id"].(string)] = tk
	}
	refs := func(id string, n int) []any {
		var out []any
		for i := range n {
			key := fmt.Sprintf("k%d", i)
			a.do("POST", "/v1/tasks/"+id+"/signals/go", map[string]any{"idempotency_key": key}).want(t, 202)
			out = append(out, map[string]any{"name": "go", "idempotency_key": key})
		}
		return out
	}
	consumed := func(id string) (n int) {
		for _, s := range a.do("GET", "/v1/queues/pwc/tasks/"+id, nil).want(t, 200).JSON["signals"].([]any) {
			if s.(map[string]any)["consumed"] == true {
				n++
			}
		}
		return n
	}
	got := refs("c-0", 65)
	bad := a.do("POST", "/v1/queues/pwc/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "c-0", "token": byID["c-0"]["token"], "ok": true, "received_signals": got}}}).want(t, 400)
	if !strings.Contains(string(bad.Raw), "outcomes[0].received_signals") || !strings.Contains(string(bad.Raw), "64") {
		t.Fatalf("65 received signals: %s; want a 400 naming received_signals", bad.Raw)
	}
	if n := consumed("c-0"); n != 0 {
		t.Fatalf("the refused outcome consumed %d signals", n)
	}
	r := a.do("POST", "/v1/queues/pwc/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "c-0", "token": byID["c-0"]["token"], "ok": true, "received_signals": got[:64]}}}).want(t, 200)
	if res := r.JSON["results"].([]any)[0].(map[string]any); res["status"].(float64) != 200 || res["current_status"] != "SUCCEEDED" {
		t.Fatalf("64 received signals: %v; want SUCCEEDED", res)
	}
	if n := consumed("c-0"); n != 64 {
		t.Fatalf("the success naming 64 signals consumed %d", n)
	}
	dead := a.do("POST", "/v1/queues/pwc/outcomes", map[string]any{"session": sess, "outcomes": []any{
		map[string]any{"task_id": "c-1", "token": byID["c-1"]["token"], "error": "no", "permanent": true, "received_signals": refs("c-1", 2)}}}).want(t, 200)
	if res := dead.JSON["results"].([]any)[0].(map[string]any); res["current_status"] != "DEAD" {
		t.Fatalf("a permanent failure: %v; want DEAD", res)
	}
	if n := consumed("c-1"); n != 0 {
		t.Fatalf("the dead letter consumed %d signals; want none", n)
	}
}
