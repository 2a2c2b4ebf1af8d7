package httpapi_test

import (
	"strings"
	"testing"
)

// TestQueueBadInput: on every queue route, malformed JSON, wrong types,
// unknown fields, oversized bodies, invalid queue names and out-of-range
// values get a 400 (413 for size, 415 for a media type) problem document,
// and write nothing.
func TestQueueBadInput(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	a.do("POST", "/v1/queues/bad/tasks", qtasksJSON("b", 1)).want(t, 200)
	sess := a.session(10)
	tk := a.qclaim("bad", sess, 1, "")[0]
	tok := tk["token"]
	big := `{"session":"` + sess + `","token":1,"result":"` + strings.Repeat("x", 2<<20) + `"}`
	cases := []struct {
		name, method, path string
		body               any
		code               int
		hdr                []string
	}{
		{"submit malformed", "POST", "/v1/queues/bad/tasks", `[{"task_id":"z1",`, 400, nil},
		{"submit not an array", "POST", "/v1/queues/bad/tasks", `{"task_id":"z1","task_type":"x"}`, 400, nil},
		{"submit wrong type", "POST", "/v1/queues/bad/tasks", `[{"task_id":"z1","task_type":"x"},{"task_id":"z2","task_type":7}]`, 400, nil},
		{"submit unknown field", "POST", "/v1/queues/bad/tasks", `[{"task_id":"z1","task_type":"x"},{"task_id":"z2","task_type":"x","colour":1}]`, 400, nil},
		{"submit invalid task", "POST", "/v1/queues/bad/tasks", `[{"task_id":"z1","task_type":"x","max_retries":1000}]`, 400, nil},
		{"submit trailing data", "POST", "/v1/queues/bad/tasks", `[{"task_id":"z1","task_type":"x"}] []`, 400, nil},
		{"submit bad queue", "POST", "/v1/queues/b%20d/tasks", `[{"task_id":"z1","task_type":"x"}]`, 400, nil},
		{"submit media type", "POST", "/v1/queues/bad/tasks", `task_id=z1`, 415, []string{"Content-Type: text/plain"}},
		{"claim malformed", "POST", "/v1/queues/bad/claim", `{"session":`, 400, nil},
		{"claim wrong type", "POST", "/v1/queues/bad/claim", map[string]any{"session": sess, "max": "2"}, 400, nil},
		{"claim unknown field", "POST", "/v1/queues/bad/claim", map[string]any{"session": sess, "count": 2}, 400, nil},
		{"claim max", "POST", "/v1/queues/bad/claim", map[string]any{"session": sess, "max": 101}, 400, nil},
		{"claim wait", "POST", "/v1/queues/bad/claim", map[string]any{"session": sess, "wait": "soon"}, 400, nil},
		{"claim session", "POST", "/v1/queues/bad/claim", map[string]any{"session": "xyz"}, 400, nil},
		{"claim no session", "POST", "/v1/queues/bad/claim", map[string]any{"max": 1}, 400, nil},
		{"claim bad queue", "POST", "/v1/queues/..%2f/claim", map[string]any{"session": sess}, 400, nil},
		{"claim oversize", "POST", "/v1/queues/bad/claim", `{"session":"` + sess + `","wait":"` + strings.Repeat("1", 2<<20) + `"}`, 413, nil},
		{"ack malformed", "POST", "/v1/queues/bad/tasks/b-0/ack", `{"token":`, 400, nil},
		{"ack wrong type", "POST", "/v1/queues/bad/tasks/b-0/ack", map[string]any{"session": sess, "token": "1"}, 400, nil},
		{"ack unknown field", "POST", "/v1/queues/bad/tasks/b-0/ack", map[string]any{"session": sess, "token": tok, "output": 1}, 400, nil},
		{"ack no token", "POST", "/v1/queues/bad/tasks/b-0/ack", map[string]any{"session": sess}, 400, nil},
		{"ack bad task id", "POST", "/v1/queues/bad/tasks/a%20b/ack", map[string]any{"session": sess, "token": tok}, 400, nil},
		{"ack bad queue", "POST", "/v1/queues/a%20b/tasks/b-0/ack", map[string]any{"session": sess, "token": tok}, 400, nil},
		{"ack oversize", "POST", "/v1/queues/bad/tasks/b-0/ack", big, 413, nil},
		{"fail no error", "POST", "/v1/queues/bad/tasks/b-0/fail", map[string]any{"session": sess, "token": tok}, 400, nil},
		{"fail wrong type", "POST", "/v1/queues/bad/tasks/b-0/fail", map[string]any{"session": sess, "token": tok, "error": "e", "permanent": "yes"}, 400, nil},
		{"fail unknown field", "POST", "/v1/queues/bad/tasks/b-0/fail", map[string]any{"session": sess, "token": tok, "error": "e", "retry": true}, 400, nil},
		{"heartbeat malformed", "POST", "/v1/queues/bad/tasks/b-0/heartbeat", `{`, 400, nil},
		{"heartbeat session", "POST", "/v1/queues/bad/tasks/b-0/heartbeat", map[string]any{"session": "nope", "token": tok}, 400, nil},
		{"list status", "GET", "/v1/queues/bad/tasks?status=DONE", nil, 400, nil},
		{"list limit", "GET", "/v1/queues/bad/tasks?limit=5000", nil, 400, nil},
		{"list cursor", "GET", "/v1/queues/bad/tasks?after=%7B%7D", nil, 400, nil},
		{"list bad queue", "GET", "/v1/queues/a%20b/tasks", nil, 400, nil},
		{"stats bad queue", "GET", "/v1/queues/a%20b/stats", nil, 400, nil},
		{"get bad id", "GET", "/v1/queues/bad/tasks/a%20b", nil, 400, nil},
		{"cancel bad id", "POST", "/v1/queues/bad/tasks/a%20b/cancel", nil, 400, nil},
		{"dlq bad limit", "GET", "/v1/queues/bad/dlq?limit=0", nil, 400, nil},
		{"dlq requeue bad queue", "POST", "/v1/queues/a%20b/dlq/requeue", nil, 400, nil},
		{"dlq purge bad id", "DELETE", "/v1/queues/bad/dlq/a%20b", nil, 400, nil},
	}
	for _, c := range cases {
		before := a.keyCount()
		r := a.do(c.method, c.path, c.body, c.hdr...)
		if r.Status != c.code {
			t.Errorf("%s: status %d, want %d: %s", c.name, r.Status, c.code, r.Raw)
			continue
		}
		r.problem(t, c.code)
		if after := a.keyCount(); after != before {
			t.Errorf("%s: keys %d → %d", c.name, before, after)
		}
	}
	// The claim still holds: none of the above touched it.
	a.do("POST", qtaskPath("bad", tk, "ack"), qfence(sess, tk)).want(t, 200)
}
