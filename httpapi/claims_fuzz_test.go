package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
)

// FuzzClaimBody fuzzes the body of POST /v1/queues/{q}/claim
// ({"session":S,"max":N,"wait":W}) through the real handler, on a queue
// that is kept supplied with tasks. "$SESSION" in the body stands for a
// live session's id. A malformed session is a 400 at body.session, a max
// out of 1..100 one at body.max, a wait that is no duration one at
// body.wait; a well-formed session that does not exist is a 404. A valid
// claim answers at most max tasks (1 by default), each RUNNING in the
// queue with an attempt and a token, and each of them can be acked with
// that token.
func FuzzClaimBody(f *testing.F) {
	a := newFuzzAPI(f)
	pool := newTaskPool(f, a, "claims")
	for _, s := range []string{
		`{"session":"$SESSION"}`, `{"session":"$SESSION","max":3}`, `{"session":"$SESSION","max":100,"wait":"5ms"}`,
		`{"session":"$SESSION","max":0}`, `{"session":"$SESSION","max":101}`, `{"session":"$SESSION","max":2.5}`,
		`{"session":"$SESSION","wait":"soon"}`, `{"session":"$SESSION","wait":"-1s"}`, `{"session":"zz"}`,
		`{"session":"1.abcdefghijklmnop"}`, `{"max":1}`, `{"session":"$SESSION","x":1}`, `{}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		pool.fill(t)
		body = bytes.ReplaceAll(body, []byte("$SESSION"), []byte(pool.session))
		ans := a.send(t, http.MethodPost, "/v1/queues/"+pool.q+"/claim", "application/json", body)
		obj, isObj := decodeObject(body)
		rawMax, clearMax := fieldOf(obj, "max")
		rawSession, clearSession := fieldOf(obj, "session")
		rawWait, clearWait := fieldOf(obj, "wait")
		var session, wait string
		_ = json.Unmarshal(rawSession, &session)
		_ = json.Unmarshal(rawWait, &wait)
		d, werr := time.ParseDuration(wait)
		switch {
		case !isObj:
			wantBadAt(t, body, ans, "body")
		case clearMax && outOfRange(rawMax, 1, 100):
			wantBadAt(t, body, ans, "body.max")
		case clearSession && !sessionIDPattern.MatchString(session):
			wantBadAt(t, body, ans, "body")
		case clearWait && wait != "" && (werr != nil || d < 0):
			wantBadAt(t, body, ans, "body")
		case clearSession && session != pool.session && ans.Status != http.StatusNotFound && ans.Status != http.StatusBadRequest:
			t.Fatalf("%q: another session, %d: %s", body, ans.Status, ans.Raw)
		}
		if ans.Status != http.StatusOK {
			return
		}
		var got struct{ Tasks []httpapiTask }
		if err := json.Unmarshal(ans.Raw, &got); err != nil {
			t.Fatalf("%q: claimed %s: %v", body, ans.Raw, err)
		}
		most, ok := plainInt(rawMax)
		if !ok || !clearMax {
			most = 100
		} else if rawMax == nil {
			most = 1
		}
		if int64(len(got.Tasks)) > most {
			t.Fatalf("%q: %d tasks claimed, at most %d asked", body, len(got.Tasks), most)
		}
		for _, tk := range got.Tasks {
			if tk.Status != queue.Running || tk.Queue != pool.q || tk.Attempt < 1 || tk.Token < 1 {
				t.Fatalf("%q: claimed %+v", body, tk)
			}
			ack := fmt.Sprintf(`{"session":%q,"token":%d}`, pool.session, tk.Token)
			if r := a.do(t, http.MethodPost, "/v1/queues/"+pool.q+"/tasks/"+tk.ID+"/ack", ack); r.Status != http.StatusOK {
				t.Fatalf("task %s claimed with token %d, then acked: %d %s", tk.ID, tk.Token, r.Status, r.Raw)
			}
		}
	})
}

// FuzzOutcomeBody fuzzes the bodies of POST /v1/queues/{q}/tasks/{id}/ack
// ({"session":S,"token":N,"result":R}) and .../fail ({"session":S,
// "token":N,"error":E,"permanent":B}), kind picking which, through the
// real handler, on a task the session holds a claim on. "$SESSION" and
// "$TOKEN" in the body stand for the claim's session and token. A
// malformed session is a 400 at body.session, a token under 1 one at
// body.token, a fail without an error one at body.error; another token or
// session is a 409 and changes nothing. The claim's own ack succeeds with
// the result sent, which the task keeps; its own fail leaves the task
// RETRYING, or DEAD when permanent.
func FuzzOutcomeBody(f *testing.F) {
	a := newFuzzAPI(f)
	pool := newTaskPool(f, a, "outcomes")
	for _, s := range []string{
		`{"session":"$SESSION","token":$TOKEN}`, `{"session":"$SESSION","token":$TOKEN,"result":{"ok":true,"n":[1,2.50]}}`,
		`{"session":"$SESSION","token":$TOKEN,"result":null}`, `{"session":"$SESSION","token":$TOKEN,"result":"text"}`,
		`{"session":"$SESSION","token":$TOKEN,"error":"boom"}`, `{"session":"$SESSION","token":$TOKEN,"error":"boom","permanent":true}`,
		`{"session":"$SESSION","token":$TOKEN,"error":""}`, `{"session":"$SESSION","token":1}`, `{"session":"$SESSION","token":0}`,
		`{"session":"$SESSION","token":-$TOKEN}`, `{"session":"zz","token":$TOKEN}`, `{"session":"1.abcdefghijklmnop","token":$TOKEN}`,
		`{"token":$TOKEN}`, `{"session":"$SESSION","token":"$TOKEN"}`, `{"session":"$SESSION","token":$TOKEN,"result":}`, ``,
	} {
		f.Add(uint8(0), []byte(s))
		f.Add(uint8(1), []byte(s))
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		id, token := pool.claimed(t)
		body = bytes.ReplaceAll(body, []byte("$SESSION"), []byte(pool.session))
		body = bytes.ReplaceAll(body, []byte("$TOKEN"), []byte(strconv.FormatInt(token, 10)))
		route := "ack"
		if kind%2 == 1 {
			route = "fail"
		}
		ans := a.send(t, http.MethodPost, "/v1/queues/"+pool.q+"/tasks/"+id+"/"+route, "application/json", body)
		var b struct {
			Session   string
			Token     int64
			Result    json.RawMessage
			Error     *string
			Permanent bool
		}
		obj, isObj := decodeObject(body)
		plain := isObj && json.Unmarshal(body, &b) == nil
		switch {
		case !isObj:
			wantBadAt(t, body, ans, "body")
		case outOfRange(tokenField(obj), 1, math.MaxInt64):
			wantBadAt(t, body, ans, "body.token")
		case plain && !sessionIDPattern.MatchString(b.Session):
			wantBadAt(t, body, ans, "body")
		case plain && route == "fail" && (b.Error == nil || *b.Error == ""):
			wantBadAt(t, body, ans, "body")
		case plain && (b.Session != pool.session || b.Token != token) && ans.Status < 400:
			t.Fatalf("%s %q: another claim's outcome recorded: %s", route, body, ans.Raw)
		}
		if ans.Status != http.StatusOK {
			return
		}
		pool.done()
		var got httpapiTask
		if err := json.Unmarshal(ans.Raw, &got); err != nil {
			t.Fatalf("%s %q: %s: %v", route, body, ans.Raw, err)
		}
		want := queue.Succeeded
		if route == "fail" {
			want = queue.Retrying
			if b.Permanent {
				want = queue.Dead
			}
		}
		if got.ID != id || got.Status != want && !(route == "fail" && got.Status == queue.Dead && got.Attempt > 100) {
			t.Fatalf("%s %q of task %s: answered %+v, want %s", route, body, id, got, want)
		}
		if route == "ack" && !sameResult(b.Result, got.Result) {
			t.Fatalf("ack %q: result %s kept as %s", body, b.Result, got.Result)
		}
	})
}

// httpapiTask is the part of a queue task answer the targets check.
type httpapiTask struct {
	ID      string          `json:"task_id"`
	Queue   string          `json:"queue"`
	Status  queue.Status    `json:"current_status"`
	Attempt int             `json:"attempt"`
	Token   int64           `json:"token"`
	Result  json.RawMessage `json:"result"`
}

// sameResult reports whether an ack's result sent and the result kept are
// the same JSON value, an absent or null one being none.
func sameResult(sent, kept json.RawMessage) bool {
	if len(sent) == 0 || string(sent) == "null" {
		return len(kept) == 0
	}
	var x, y any
	if json.Unmarshal(sent, &x) == nil && json.Unmarshal(kept, &y) == nil {
		return reflect.DeepEqual(x, y)
	}
	// Numbers beyond float64 (1e400): the same text once compacted.
	var cx, cy bytes.Buffer
	return json.Compact(&cx, sent) == nil && json.Compact(&cy, kept) == nil && bytes.Equal(cx.Bytes(), cy.Bytes())
}

// tokenField is a body's token when the body names it plainly.
func tokenField(obj map[string]json.RawMessage) json.RawMessage {
	raw, clear := fieldOf(obj, "token")
	if !clear {
		return nil
	}
	return raw
}

// taskPool is a queue kept supplied with tasks, and a session claiming
// them.
type taskPool struct {
	a       *fuzzAPI
	q       string
	session string
	n       int
	// id and token are the claim FuzzOutcomeBody reports on; "" when
	// none is held.
	id    string
	token int64
}

func newTaskPool(f *testing.F, a *fuzzAPI, q string) *taskPool {
	f.Helper()
	return &taskPool{a: a, q: q, session: a.fixtureSession(f)}
}

// fill submits a batch of tasks once every 50 calls, so that claims find
// some.
func (p *taskPool) fill(t testing.TB) {
	t.Helper()
	if p.n%50 == 0 {
		p.supply(t)
	}
	p.n++
}

// supply submits a batch of tasks with a large retry budget.
func (p *taskPool) supply(t testing.TB) {
	t.Helper()
	var lines []string
	for i := range 20 {
		lines = append(lines, fmt.Sprintf(`{"task_id":"%s-%d-%d-%d","task_type":"fuzz","max_retries":100}`, p.q, os.Getpid(), p.n, i))
	}
	p.n++
	if r := p.a.send(t, http.MethodPost, "/v1/queues/"+p.q+"/tasks", "application/x-ndjson", []byte(strings.Join(lines, "\n"))); r.Status != http.StatusOK {
		t.Fatalf("supply queue %s: %d %s", p.q, r.Status, r.Raw)
	}
}

// claimed returns the claim held, claiming a task first when none is.
func (p *taskPool) claimed(t testing.TB) (id string, token int64) {
	t.Helper()
	for try := 0; p.id == "" && try < 3; try++ {
		r := p.a.do(t, http.MethodPost, "/v1/queues/"+p.q+"/claim", fmt.Sprintf(`{"session":%q,"max":1}`, p.session))
		var got struct{ Tasks []httpapiTask }
		if r.Status != http.StatusOK || json.Unmarshal(r.Raw, &got) != nil {
			t.Fatalf("claim from %s: %d %s", p.q, r.Status, r.Raw)
		}
		if len(got.Tasks) == 1 {
			p.id, p.token = got.Tasks[0].ID, got.Tasks[0].Token
		} else {
			p.supply(t)
		}
	}
	if p.id == "" {
		t.Fatalf("no task to claim in %s", p.q)
	}
	return p.id, p.token
}

// done forgets the claim held: its outcome was recorded.
func (p *taskPool) done() { p.id, p.token = "", 0 }
