package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/paxostest"
	"github.com/droverhq/drover/paxos/client"
)

// lockTarget is a server of the lock service's routes, and the fencing
// token of the last grant it answered.
type lockTarget struct {
	name  string
	base  string
	hdr   http.Header
	token string
}

// contractStep is one request of the contract and what it must answer.
type contractStep struct {
	method, path string
	// body is sent as is; {token} stands for the target's last token.
	body string
	// ct is the Content-Type sent with a body; "" sends curl -d's.
	ct   string
	key  string // Idempotency-Key
	want int
	// hold, instead of a request, has lock hold taken by a holder named
	// "agent-s" that owner and token do not prove: on drover server a
	// session of that name (a session's lock is proved by its session
	// and contender), on the node the owner agent-s, whose token the
	// target then keeps one above the holding's.
	hold string
}

// lockContract is the lock service's contract: the Paxos node's answers,
// which drover server's /locks must give too.
var lockContract = []contractStep{
	{method: "POST", path: "/locks/seed-1", body: `{"owner":"worker-7","ttl":30}`, want: 200},
	{method: "POST", path: "/locks/seed-1", body: `{"owner":"worker-8","ttl":30}`, ct: "application/json", want: 409},
	{method: "POST", path: "/locks/seed-1", body: `{"owner":"worker-7","ttl":30}`, want: 409},
	{method: "GET", path: "/locks/seed-1", want: 200},
	{method: "GET", path: "/locks/nobody", want: 404},
	{method: "GET", path: "/locks", want: 200},
	{method: "POST", path: "/locks/seed-1/renew", body: `{"owner":"worker-7","token":{token},"ttl":60}`, want: 200},
	{method: "POST", path: "/locks/seed-1/renew", body: `{"owner":"worker-8","token":{token},"ttl":60}`, want: 409},
	{method: "POST", path: "/locks/seed-1/renew", body: `{"owner":"worker-7","token":{token}}`, want: 400},
	{method: "GET", path: "/locks/seed-1", want: 200},
	// A release must name the holder: another owner with the right token
	// gets 409 and releases nothing.
	{method: "DELETE", path: "/locks/seed-1", body: `{"owner":"worker-9","token":{token}}`, want: 409},
	{method: "GET", path: "/locks/seed-1", want: 200},
	{method: "DELETE", path: "/locks/seed-1", body: `{"owner":"worker-7","token":1}`, want: 409},
	{method: "DELETE", path: "/locks/seed-1", body: `{"owner":"worker-7","token":{token},"ttl":1}`, want: 400},
	{method: "DELETE", path: "/locks/seed-1", body: `{"owner":"worker-7"}`, want: 400},
	{method: "DELETE", path: "/locks/seed-1", body: `{"owner":"worker-7","token":{token}}`, key: "release-1", want: 200},
	{method: "DELETE", path: "/locks/seed-1", body: `{"owner":"worker-7","token":{token}}`, want: 409},
	{method: "POST", path: "/locks/seed-1/renew", body: `{"owner":"worker-7","token":{token},"ttl":5}`, want: 409},
	{method: "GET", path: "/locks/seed-1", want: 404},
	{method: "GET", path: "/locks", want: 200},
	{method: "POST", path: "/locks/seed-2", body: `{"owner":"worker-7","ttl":2.5,"holder":{"host":"box-1","pid":42,"task":"t-9"}}`, ct: "application/json", want: 200},
	{method: "GET", path: "/locks/seed-2", want: 200},
	{method: "GET", path: "/locks", want: 200},
	// Bad requests.
	{method: "POST", path: "/locks/seed-3", body: `{}`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: ``, want: 400},
	{method: "DELETE", path: "/locks/seed-3", want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":-1}`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":86401}`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":"30"}`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":30,"session":"x"}`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":30,"holder":[1]}`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":30`, want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w","ttl":30} {}`, want: 400},
	// Text that is not UTF-8 is refused, not replaced with U+FFFD; a
	// U+FFFD the request spells is text like any other.
	{method: "POST", path: "/locks/seed-3", body: "{\"owner\":\"w\xff\xfe\",\"ttl\":30}", want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w\ud800","ttl":30}`, want: 400},
	{method: "DELETE", path: "/locks/seed-2", body: "{\"owner\":\"worker-7\xff\",\"token\":5}", want: 400},
	{method: "POST", path: "/locks/seed-3", body: `{"owner":"w \ufffd and ` + "\uFFFD" + `","ttl":30}`, want: 200},
	{method: "GET", path: "/locks/seed-3", want: 200},
	{method: "POST", path: "/locks/seed-4", body: `{"owner":"w","ttl":30}`, key: "has space", want: 400},
	{method: "POST", path: "/locks/a%20b", body: `{"owner":"w","ttl":30}`, want: 400},
	// A request sent again with its Idempotency-Key gets the same grant.
	{method: "POST", path: "/locks/seed-5", body: `{"owner":"worker-7","ttl":30}`, key: "acquire-5", want: 200},
	{method: "POST", path: "/locks/seed-5", body: `{"owner":"worker-7","ttl":30}`, key: "acquire-5", want: 200},
	{method: "POST", path: "/locks/seed-5", body: `{"owner":"worker-7","ttl":30}`, key: "acquire-6", want: 409},
	// A session's lock shows its session's name as owner, and its token,
	// to anyone: they do not prove its holding, so they neither renew
	// nor release it.
	{hold: "seed-6"},
	{method: "POST", path: "/locks/seed-6/renew", body: `{"owner":"agent-s","token":{token},"ttl":3600}`, want: 409},
	{method: "DELETE", path: "/locks/seed-6", body: `{"owner":"agent-s","token":{token}}`, want: 409},
	{method: "GET", path: "/locks/seed-6", want: 200},
}

// TestLockServiceContract runs the lock service's contract against a
// Paxos node group and against drover server's /locks: every request gets
// the same status and the same JSON (tokens, times and ttls apart, which
// each backend has its own of).
func TestLockServiceContract(t *testing.T) {
	a := newAPI(t)
	g := paxostest.Start(t, 1)
	targets := []*lockTarget{
		{name: "paxos", base: "http://" + g.Endpoints[0], hdr: http.Header{}},
		{name: "server", base: a.base, hdr: http.Header{"Drover-Namespace": {a.ns}}},
	}
	hc := &http.Client{Timeout: 30 * time.Second}
	for i, st := range lockContract {
		if st.hold != "" {
			for _, tg := range targets {
				tg.holdFor(t, hc, st.hold)
			}
			continue
		}
		var got [2]any
		for j, tg := range targets {
			status, body := tg.send(t, hc, st)
			if status != st.want {
				t.Fatalf("step %d %s %s %s on %s: status %d, want %d; body %s", i, st.method, st.path, st.body, tg.name, status, st.want, body)
			}
			got[j] = normalize(t, body)
		}
		if !reflect.DeepEqual(got[0], got[1]) {
			t.Errorf("step %d %s %s %s: answers differ\npaxos:  %v\nserver: %v", i, st.method, st.path, st.body, got[0], got[1])
		}
	}
}

// send makes st's request to tg and returns the status and body; a grant
// sets tg's token.
func (tg *lockTarget) send(t *testing.T, hc *http.Client, st contractStep) (int, []byte) {
	t.Helper()
	var rd io.Reader
	if st.body != "" {
		rd = strings.NewReader(strings.ReplaceAll(st.body, "{token}", tg.token))
	}
	req, err := http.NewRequest(st.method, tg.base+st.path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header = tg.hdr.Clone()
	if rd != nil {
		ct := st.ct
		if ct == "" {
			ct = "application/x-www-form-urlencoded" // what curl -d sends
		}
		req.Header.Set("Content-Type", ct)
	}
	if st.key != "" {
		req.Header.Set(client.IdempotencyHeader, st.key)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s on %s: %v", st.method, st.path, tg.name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("%s %s on %s: Content-Type %q, want application/json; body %s", st.method, st.path, tg.name, ct, body)
	}
	var ok client.AcquireResponse
	if resp.StatusCode == 200 && st.method == "POST" && !strings.HasSuffix(st.path, "/renew") && json.Unmarshal(body, &ok) == nil {
		tg.token = strconv.FormatUint(ok.Token, 10)
	}
	return resp.StatusCode, body
}

// holdFor has lock name taken by a holder named agent-s whom owner and
// token do not prove (see contractStep.hold).
func (tg *lockTarget) holdFor(t *testing.T, hc *http.Client, name string) {
	t.Helper()
	post := func(path, body string) map[string]any {
		req, err := http.NewRequest("POST", tg.base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header = tg.hdr.Clone()
		req.Header.Set("Content-Type", "application/json")
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode/100 != 2 {
			t.Fatalf("POST %s on %s: %d %v %v", path, tg.name, resp.StatusCode, out, err)
		}
		return out
	}
	if tg.name == "paxos" {
		tok := post("/locks/"+name, `{"owner":"agent-s","ttl":30}`)["token"].(float64)
		tg.token = strconv.FormatUint(uint64(tok)+1, 10)
		return
	}
	sid := post("/v1/sessions", `{"ttl":30,"name":"agent-s"}`)["id"].(string)
	tok := post("/v1/locks/"+name, `{"session":"`+sid+`"}`)["token"].(float64)
	tg.token = strconv.FormatUint(uint64(tok), 10)
}

// normalize decodes body with each backend's own numbers (token, times,
// ttl) replaced by their kind.
func normalize(t *testing.T, body []byte) any {
	t.Helper()
	var v any
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatalf("answer is not JSON: %v: %s", err, body)
	}
	var walk func(any) any
	walk = func(v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				switch k {
				case "token", "expires", "acquired", "ttl":
					if _, ok := e.(float64); ok {
						x[k] = "<number>"
						continue
					}
				}
				x[k] = walk(e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(e)
			}
		}
		return v
	}
	return walk(v)
}

// TestPaxosClientOnServer points the Paxos lock service's Go client at
// drover server: every call works as against the nodes.
func TestPaxosClientOnServer(t *testing.T) {
	a := newAPI(t)
	c, err := client.New(client.Config{Endpoints: []string{a.base}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	defer func() { _ = c.Close(ctx) }()
	li, err := c.Acquire(ctx, "build", client.AcquireRequest{Owner: "w1", TTL: 30 * time.Second, Holder: json.RawMessage(`{"host":"box"}`)})
	if err != nil || li.Token == 0 || li.Owner != "w1" || string(li.Holder) != `{"host":"box"}` {
		t.Fatalf("Acquire = %+v, %v", li, err)
	}
	var he *client.HeldError
	if _, err := c.Acquire(ctx, "build", client.AcquireRequest{Owner: "w2", TTL: time.Second}); !errors.As(err, &he) || he.Holder.Owner != "w1" || he.Holder.Token != li.Token {
		t.Fatalf("second Acquire: %v, want a HeldError naming w1", err)
	}
	if got, err := c.Get(ctx, "build"); err != nil || got.Owner != "w1" || got.Token != li.Token || got.TTL <= 0 {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := c.Get(ctx, "free"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Get of a free lock: %v, want ErrNotFound", err)
	}
	rn, err := c.Renew(ctx, "build", "w1", li.Token, time.Minute)
	if err != nil || rn.Token != li.Token || rn.Expires <= li.Expires {
		t.Fatalf("Renew = %+v, %v (acquired %+v)", rn, err, li)
	}
	if all, err := c.List(ctx); err != nil || len(all) != 1 || all[0].LockID != "build" {
		t.Fatalf("List = %+v, %v", all, err)
	}
	var nh *client.NotHeldError
	if err := c.Release(ctx, "build", "w2", li.Token); !errors.As(err, &nh) || nh.Current == nil || nh.Current.Owner != "w1" {
		t.Fatalf("Release by another owner: %v, want a NotHeldError naming w1", err)
	}
	if err := c.Release(ctx, "build", "w1", li.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(ctx, "build"); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("Get after Release: %v, want ErrNotFound", err)
	}
}

// TestLockServiceTaskLocks: the task runner's locks (task:ID) are taken
// and given back through the agent-task routes only, so /locks refuses to
// change them, in the lock service's error shape; it reads them as any.
func TestLockServiceTaskLocks(t *testing.T) {
	a := newAPI(t)
	for _, tc := range []struct{ method, path, body string }{
		{"POST", "/locks/task:job-1", `{"owner":"w","ttl":5}`},
		{"DELETE", "/locks/task:job-1", `{"owner":"w","token":5}`},
		{"POST", "/locks/task:job-1/renew", `{"owner":"w","token":5,"ttl":5}`},
	} {
		r := a.do(tc.method, tc.path, tc.body).want(t, 400)
		if !strings.Contains(r.str("error"), "agent-tasks") {
			t.Fatalf("%s %s: %s", tc.method, tc.path, r.Raw)
		}
	}
	if r := a.do("GET", "/locks/task:job-1", nil).want(t, 404); r.str("error") != client.MsgNotFound {
		t.Fatalf("GET of a free task lock: %s", r.Raw)
	}
}
