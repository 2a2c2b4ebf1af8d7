package httpapi_test

import (
	"bytes"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"unicode/utf8"
)

// sessionIDPattern is the form of a session id.
var sessionIDPattern = regexp.MustCompile(`^[0-9a-f]{1,16}\.[a-z2-7]{16,64}$`)

// FuzzSessionBody fuzzes the body of POST /v1/sessions ({"ttl":N,"name":S})
// through the real handler. A body that is not a JSON object is a 400 at
// body; a ttl out of 1..86400 a 400 at body.ttl, a name over 128
// characters or not UTF-8 text one at body.name, an unknown field one in the body; a body
// of known fields in range creates a session. A created session has an id
// of the documented form, the name sent and at least the TTL asked (15 s
// when none is), and can be read and deleted.
func FuzzSessionBody(f *testing.F) {
	a := newFuzzAPI(f)
	for _, s := range []string{
		`{"ttl":5,"name":"worker-1"}`, `{}`, `{"ttl":86400}`, `{"ttl":86401}`, `{"ttl":0}`, `{"ttl":-1}`, `{"ttl":1e3}`, `{"ttl":5.5}`,
		`{"ttl":"5"}`, `{"name":null}`, `{"TTL":5}`, `{"x":1}`, `{"ttl":5}{"ttl":6}`, `[]`, `"s"`, ``, `{`, `{"name":"é"}`,
		`{"name":"` + string(bytes.Repeat([]byte("n"), 129)) + `"}`, `{"ttl":5,"ttl":7}`, "{\"name\":\"\xff\"}",
		`{"name":"\ud800"}`, `{"name":"\ud83d\ude00 \ufffd"}`, `{"name":"a","host":"b\udc00","pid":1}`, "{\"\":0,\"name\":\"\x80\"}", `{"name":"\\ud800"}`, `{"name":"\\\ud800"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		ans := a.send(t, http.MethodPost, "/v1/sessions", "application/json", body)
		obj, isObj := decodeObject(body)
		ttl, clearTTL := fieldOf(obj, "ttl")
		name, clearName := fieldOf(obj, "name")
		switch {
		case !isObj:
			wantBadAt(t, body, ans, "body")
		case !onlyKeys(obj, "ttl", "name") && ans.Status != http.StatusCreated:
			// A body with an unknown field and a bad ttl or name may be
			// refused for either fault: any place in the body will do.
			wantBadAt(t, body, ans, "body")
		case clearTTL && outOfRange(ttl, 1, 86400):
			wantBadAt(t, body, ans, "body.ttl")
		case clearName && nameTooLong(name, 128), clearName && notText(name):
			wantBadAt(t, body, ans, "body.name")
		case plainSessionBody(obj) && ans.Status != http.StatusCreated:
			t.Fatalf("%q: %d, want 201: %s", body, ans.Status, ans.Raw)
		}
		if ans.Status != http.StatusCreated {
			return
		}
		var sent, got struct {
			TTL  int64  `json:"ttl"`
			Name string `json:"name"`
			ID   string `json:"id"`
		}
		_ = json.Unmarshal(body, &sent)
		if err := json.Unmarshal(ans.Raw, &got); err != nil {
			t.Fatalf("%q: created %s: %v", body, ans.Raw, err)
		}
		if sent.TTL == 0 {
			sent.TTL = 15
		}
		if !sessionIDPattern.MatchString(got.ID) || got.Name != sent.Name || got.TTL < sent.TTL {
			t.Fatalf("%q: created %s, asked ttl %d name %q", body, ans.Raw, sent.TTL, sent.Name)
		}
		if r := a.send(t, http.MethodGet, "/v1/sessions/"+got.ID, "", nil); r.Status != http.StatusOK {
			t.Fatalf("session %s created, then read: %d %s", got.ID, r.Status, r.Raw)
		}
		if r := a.send(t, http.MethodDelete, "/v1/sessions/"+got.ID, "", nil); r.Status != http.StatusNoContent {
			t.Fatalf("session %s created, then deleted: %d %s", got.ID, r.Status, r.Raw)
		}
	})
}

// wantBadAt fails t unless ans is a 400 naming loc (or a place in it).
func wantBadAt(t *testing.T, body []byte, ans answer, loc string) {
	t.Helper()
	if ans.Status != http.StatusBadRequest {
		t.Fatalf("%q: %d, want 400 at %s: %s", body, ans.Status, loc, ans.Raw)
	}
	if len(ans.Prob.Errors) > 0 && !ans.hasLocation(loc) {
		t.Fatalf("%q: 400 not at %s: %s", body, loc, ans.Raw)
	}
}

// outOfRange reports whether raw is a JSON integer (digits only, no
// fraction or exponent) outside lo..hi.
func outOfRange(raw json.RawMessage, lo, hi int64) bool {
	n, ok := plainInt(raw)
	return ok && (n < lo || n > hi)
}

// plainInt reads raw as a JSON integer written with digits only.
func plainInt(raw json.RawMessage) (int64, bool) {
	if len(raw) == 0 || bytes.ContainsAny(raw, ".eE") {
		return 0, false
	}
	var n int64
	if json.Unmarshal(raw, &n) != nil {
		return 0, false
	}
	return n, true
}

// nameTooLong reports whether raw is a JSON string of more than max
// characters.
func nameTooLong(raw json.RawMessage, max int) bool {
	var s string
	return len(raw) > 0 && json.Unmarshal(raw, &s) == nil && utf8.RuneCountInString(s) > max
}

// loneSurrogate reports whether raw, a JSON string, holds a \u escape of
// a UTF-16 surrogate that is not half of a pair. It reads the escapes in
// order, so an escaped backslash followed by "ud800" is text, not an
// escape.
func loneSurrogate(raw []byte) bool {
	unit := func(i int) (rune, bool) { // the \uXXXX escape at raw[i:], if any
		if i+6 > len(raw) || raw[i] != '\\' || raw[i+1] != 'u' {
			return 0, false
		}
		n, err := strconv.ParseUint(string(raw[i+2:i+6]), 16, 16)
		return rune(n), err == nil
	}
	for i := 0; i < len(raw); {
		if raw[i] != '\\' {
			i++
			continue
		}
		r, ok := unit(i)
		if !ok {
			i += 2 // another escape: \\, \", \n, ...
			continue
		}
		switch {
		case r >= 0xD800 && r < 0xDC00:
			if lo, ok := unit(i + 6); ok && lo >= 0xDC00 && lo <= 0xDFFF {
				i += 12
				continue
			}
			return true
		case r >= 0xDC00 && r <= 0xDFFF:
			return true
		}
		i += 6
	}
	return false
}

// notText reports whether raw, a JSON string, holds what is not UTF-8
// text: bytes that are not UTF-8, or an escape of a lone surrogate
// (encoding/json would decode either to U+FFFD).
func notText(raw json.RawMessage) bool {
	if len(raw) == 0 || raw[0] != '"' {
		return false
	}
	return !utf8.Valid(raw) || loneSurrogate(raw)
}

// onlyKeys reports whether every key of obj is one of keys.
func onlyKeys(obj map[string]json.RawMessage, keys ...string) bool {
	for k := range obj {
		found := false
		for _, want := range keys {
			found = found || k == want
		}
		if !found {
			return false
		}
	}
	return true
}

// plainSessionBody reports whether obj is a session body the rules accept
// without doubt: known keys only, ttl a plain integer in range, name a
// string.
func plainSessionBody(obj map[string]json.RawMessage) bool {
	if !onlyKeys(obj, "ttl", "name") {
		return false
	}
	if raw, ok := obj["ttl"]; ok {
		if n, ok := plainInt(raw); !ok || n < 1 || n > 86400 {
			return false
		}
	}
	if raw, ok := obj["name"]; ok {
		var s string
		if json.Unmarshal(raw, &s) != nil || utf8.RuneCountInString(s) > 128 || notText(raw) {
			return false
		}
	}
	return true
}
