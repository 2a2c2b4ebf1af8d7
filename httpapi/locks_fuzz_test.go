package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover/keyspace"
)

// FuzzLockAcquire fuzzes POST /v1/locks/{name}?wait=W with its body
// ({"session":S} or {"owner":O,"ttl":N}) through the real handler, on a
// server whose longest wait is cut to fuzzWait. "$SESSION" in the body
// stands for a live session's id; lock "held" is held by another owner
// throughout. An invalid lock name is a 400 at path.name, a wait that is
// no duration (or negative) a 400 at query.wait, a malformed session one
// at body.session, an owner that is not UTF-8 text one at body.owner, a body with both or neither of a session and an owner
// with a ttl one in the body. A valid request on a free lock acquires it
// with a token and a contender, by which it is released; on "held" it is
// a 409 naming the holder, whatever the wait (a wait shorter than etcd's
// answer included).
func FuzzLockAcquire(f *testing.F) {
	a := newFuzzAPI(f)
	session := a.fixtureSession(f)
	if r := a.do(f, http.MethodPost, "/v1/locks/held", `{"owner":"other","ttl":600}`); r.Status != http.StatusOK {
		f.Fatalf("hold lock held: %d %s", r.Status, r.Raw)
	}
	f.Add("jobs", "", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("jobs:1", "10ms", []byte(`{"session":"$SESSION"}`))
	f.Add("held", "", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("held", "5ms", []byte(`{"session":"$SESSION"}`))
	f.Add("a/b", "", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("task:1", "", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("a b", "1s", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("jobs", "soon", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("jobs", "-1s", []byte(`{"owner":"w1","ttl":5}`))
	f.Add("jobs", "", []byte(`{"session":"zz"}`))
	f.Add("jobs", "", []byte(`{"session":"1.abcdefghijklmnop"}`))
	f.Add("jobs", "", []byte(`{"session":"$SESSION","owner":"w1","ttl":5}`))
	f.Add("jobs", "", []byte(`{"owner":"w1"}`))
	f.Add("jobs", "", []byte("{\"owner\":\"w\xff\",\"ttl\":5}"))
	f.Add("jobs", "", []byte(`{"owner":"w\udfff","ttl":5}`))
	f.Add("jobs", "", []byte(`{"owner":"w\ufffd","ttl":5}`))
	f.Add("jobs", "", []byte("{\"\":0,\"owner\":\"w\x80\",\"ttl\":5}"))
	f.Add("jobs", "", []byte(`{"owner":"w1","ttl":0}`))
	f.Add("jobs", "", []byte(`{}`))
	f.Add("jobs", "", []byte(`[`))
	f.Add(strings.Repeat("l", 129), "", []byte(`{"owner":"w1","ttl":5}`))
	f.Fuzz(func(t *testing.T, name, wait string, body []byte) {
		if name == "" || name == "." || name == ".." {
			return // no route: the path is another one
		}
		body = bytes.ReplaceAll(body, []byte("$SESSION"), []byte(session))
		target := "/v1/locks/" + url.PathEscape(name)
		if wait != "" {
			target += "?wait=" + url.QueryEscape(wait)
		}
		ans := a.send(t, http.MethodPost, target, "application/json", body)
		if ans.Unrouted {
			return // a name of slashes only: no lock route is reached
		}
		badName := keyspace.CheckName("name", name) != nil || strings.HasPrefix(name, "task:")
		d, err := time.ParseDuration(wait)
		badWait := wait != "" && (err != nil || d < 0)
		if badName || badWait {
			if ans.Status != http.StatusBadRequest {
				t.Fatalf("%s %q: %d, want 400: %s", target, body, ans.Status, ans.Raw)
			}
			// huma rejects a malformed body before the route reads the rest.
			inBody := len(ans.Prob.Errors) == 0 || ans.hasLocation("body")
			if !inBody && (badName && !ans.hasLocation("path.name") || !badName && !ans.hasLocation("query.wait")) {
				t.Fatalf("%s %q: 400 not at the name or the wait: %s", target, body, ans.Raw)
			}
			return
		}
		var b struct {
			Session, Owner string
			TTL            int64
		}
		if json.Unmarshal(body, &b) != nil {
			wantBadAt(t, body, ans, "body")
			return
		}
		switch {
		case b.Session == "" && b.TTL >= 1 && b.TTL <= 86400 && notText(ownerOf(body)) && knownAcquireKeys(body):
			wantBadAt(t, body, ans, "body.owner")
		case b.Session != "" && b.Owner != "" && ans.Status != http.StatusBadRequest:
			t.Fatalf("%s %q: session and owner, %d: %s", target, body, ans.Status, ans.Raw)
		case b.Session != "" && b.Session != session && ans.Status < 400:
			t.Fatalf("%s %q: another session, %d: %s", target, body, ans.Status, ans.Raw)
		case b.Session == "" && (b.Owner == "" || b.TTL < 1 || b.TTL > 86400) && ans.Status != http.StatusBadRequest:
			t.Fatalf("%s %q: neither a session nor an owner and a ttl, %d: %s", target, body, ans.Status, ans.Raw)
		case name == "held" && ans.Status < 400:
			t.Fatalf("%s %q: lock held by another acquired: %s", target, body, ans.Raw)
		case name != "held" && plainAcquire(body, session) && ans.Status != http.StatusOK:
			t.Fatalf("%s %q: free lock not acquired: %d %s", target, body, ans.Status, ans.Raw)
		}
		if ans.Status == http.StatusConflict && !bytes.Contains(ans.Raw, []byte(`"holder"`)) {
			t.Fatalf("%s %q: 409 without the holder: %s", target, body, ans.Raw)
		}
		if ans.Status == http.StatusOK {
			a.release(t, name, b.Session, b.Owner, ans.Raw)
		}
	})
}

// plainAcquire reports whether body is an acquisition the rules accept
// without doubt: {"session":S} with the live session, or {"owner":O,"ttl":N}
// with N a plain integer in range.
func plainAcquire(body []byte, session string) bool {
	obj, ok := decodeObject(body)
	if !ok {
		return false
	}
	var s, owner string
	if onlyKeys(obj, "session") {
		return json.Unmarshal(obj["session"], &s) == nil && s == session
	}
	n, ok := plainInt(obj["ttl"])
	return onlyKeys(obj, "owner", "ttl") && ok && n >= 1 && n <= 86400 &&
		json.Unmarshal(obj["owner"], &owner) == nil && owner != "" && utf8.RuneCountInString(owner) <= 128 && !notText(obj["owner"])
}

// knownAcquireKeys reports whether body, a JSON object, holds only the
// fields of an acquisition: one with an unknown field as well may be
// refused for that field first.
func knownAcquireKeys(body []byte) bool {
	obj, _ := decodeObject(body)
	return onlyKeys(obj, "session", "owner", "ttl")
}

// ownerOf is the raw owner of an acquisition's body, if any.
func ownerOf(body []byte) json.RawMessage {
	obj, _ := decodeObject(body)
	return obj["owner"]
}

// release releases the lock an acquisition (its answer raw) took, and
// checks that it is free after.
func (a *fuzzAPI) release(t *testing.T, name, session, owner string, raw []byte) {
	t.Helper()
	var got struct {
		Name      string `json:"name"`
		Token     int64  `json:"token"`
		Contender string `json:"contender"`
	}
	if err := json.Unmarshal(raw, &got); err != nil || got.Name != name || got.Token < 1 || got.Contender == "" {
		t.Fatalf("lock %q acquired as %s (%v)", name, raw, err)
	}
	q := url.Values{"token": {strconv.FormatInt(got.Token, 10)}, "contender": {got.Contender}}
	if session != "" {
		q.Set("session", session)
	} else {
		q.Set("owner", owner)
	}
	path := "/v1/locks/" + url.PathEscape(name)
	if r := a.send(t, http.MethodDelete, path+"?"+q.Encode(), "", nil); r.Status != http.StatusNoContent {
		t.Fatalf("lock %q acquired (%s), then released: %d %s", name, raw, r.Status, r.Raw)
	}
	if r := a.send(t, http.MethodGet, path, "", nil); r.Status != http.StatusNotFound {
		t.Fatalf("lock %q released, and still held: %d %s", name, r.Status, r.Raw)
	}
}

// fixtureSession creates a session that lives as long as f's inputs run.
func (a *fuzzAPI) fixtureSession(f *testing.F) string {
	f.Helper()
	r := a.do(f, http.MethodPost, "/v1/sessions", `{"ttl":600,"name":"fuzz"}`)
	var s struct {
		ID string `json:"id"`
	}
	if r.Status != http.StatusCreated || json.Unmarshal(r.Raw, &s) != nil {
		f.Fatalf("create a session: %d %s", r.Status, r.Raw)
	}
	return s.ID
}
