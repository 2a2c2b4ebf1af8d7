package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"testing"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
)

// FuzzCheckpointPut fuzzes the body of POST /v1/threads/{thread}/checkpoints
// through the real handler, each input on a thread of its own. A body that
// is not a JSON object, or has no state, is a 400 at body; a checkpoint_ns with control
// characters or over 1024 bytes a 400 at body.checkpoint_ns; a
// checkpoint_id or parent_checkpoint_id that is not a name a 400 at that
// field, and so is a parent that is the checkpoint itself; a lock, session
// and token given in part a 400. A put with a parent on a new thread is a
// 409 in mode cas. A put that succeeds answers its coordinates, and reading
// the checkpoint back gives the state, namespace, parent and metadata
// sent (the metadata as the same JSON values).
func FuzzCheckpointPut(f *testing.F) {
	a := newFuzzAPI(f)
	for _, s := range []string{
		`{"state":"aGVsbG8="}`, `{"state":"","checkpoint_ns":"parent:1|child:2","checkpoint_id":"c1","metadata":{"source":"loop","step":3,"x":[1,2.50]}}`,
		`{"state":"aGk=","mode":"append","parent_checkpoint_id":"p0","checkpoint_id":"c2"}`, `{"state":"aGk=","parent_checkpoint_id":"p0"}`,
		`{"state":"aGk=","checkpoint_id":"c3","parent_checkpoint_id":"c3"}`, `{"state":"aGk=","checkpoint_id":"a/b"}`,
		`{"state":"aGk=","checkpoint_ns":"a\u0001b"}`, `{"state":"aGk=","mode":"merge"}`, `{"state":"not base64!"}`,
		`{"state":"aGk=","lock":"l"}`, `{"state":"aGk=","token":3}`, `{"state":"aGk=","metadata":{"step":0,"source":""}}`,
		`{"state":"aGk=","metadata":{"step":1e400,"writer":7}}`, `{"state":"aGk=","metadata":null}`, `{}`, `[]`, ``,
	} {
		f.Add([]byte(s))
	}
	n := 0
	f.Fuzz(func(t *testing.T, body []byte) {
		n++
		thread := fmt.Sprintf("th-%d-%d", os.Getpid(), n)
		ans := a.send(t, http.MethodPost, "/v1/threads/"+thread+"/checkpoints", "application/json", body)
		obj, isObj := decodeObject(body)
		var b struct {
			NS       string          `json:"checkpoint_ns"`
			ID       string          `json:"checkpoint_id"`
			ParentID string          `json:"parent_checkpoint_id"`
			Mode     string          `json:"mode"`
			Metadata json.RawMessage `json:"metadata"`
			State    []byte          `json:"state"`
			Lock     string          `json:"lock"`
			Session  string          `json:"session"`
			Token    int64           `json:"token"`
		}
		plain := isObj && json.Unmarshal(body, &b) == nil && onlyKeys(obj, "checkpoint_ns", "checkpoint_id",
			"parent_checkpoint_id", "mode", "metadata", "state", "lock", "session", "token")
		state, clearState := fieldOf(obj, "state")
		switch {
		case !isObj:
			wantBadAt(t, body, ans, "body")
		case clearState && state == nil:
			wantBadAt(t, body, ans, "body") // state is required
		case !plain || !bytes.HasPrefix(state, []byte(`"`)) || string(state) == `""`:
			// A state that is not a string of base64 (or is "") is a 400
			// at body.state before the route runs.
		case obj["mode"] != nil && b.Mode != "cas" && b.Mode != "append": // "" too: omit it for cas
			// The schema's enum: refused before the route checks names.
			wantBadAt(t, body, ans, "body.mode")
		case checkpoint.CheckNS(b.NS) != nil:
			wantBadAt(t, body, ans, "body.checkpoint_ns")
		case b.ID != "" && keyspace.CheckName("id", b.ID) != nil:
			wantBadAt(t, body, ans, "body.checkpoint_id")
		case b.ParentID != "" && keyspace.CheckName("id", b.ParentID) != nil:
			wantBadAt(t, body, ans, "body.parent_checkpoint_id")
		case b.ID != "" && b.ID == b.ParentID:
			wantBadAt(t, body, ans, "body.parent_checkpoint_id")
		case (b.Lock != "" || b.Session != "" || b.Token != 0) && (b.Lock == "" || b.Session == "" || b.Token == 0):
			wantBadAt(t, body, ans, "body")
		case b.Mode != "append" && b.ParentID != "" && b.Lock == "" && ans.Status != http.StatusConflict:
			t.Fatalf("%q: cas put on a new thread with a parent: %d, want 409: %s", body, ans.Status, ans.Raw)
		}
		if ans.Status != http.StatusOK {
			return
		}
		checkStored(t, a, thread, body, b.NS, b.ID, b.ParentID, b.State, b.Metadata, ans.Raw)
	})
}

// checkStored reads back the checkpoint a put answered (raw) and checks
// that it holds what the put sent.
func checkStored(t *testing.T, a *fuzzAPI, thread string, body []byte, ns, id, parent string, state, metadata []byte, raw []byte) {
	t.Helper()
	var put struct {
		ThreadID string `json:"thread_id"`
		NS       string `json:"checkpoint_ns"`
		ID       string `json:"checkpoint_id"`
		ParentID string `json:"parent_checkpoint_id"`
	}
	if err := json.Unmarshal(raw, &put); err != nil || put.ThreadID != thread || put.NS != ns || put.ParentID != parent ||
		id != "" && put.ID != id || put.ID == "" {
		t.Fatalf("%q: put answered %s (%v)", body, raw, err)
	}
	path := "/v1/threads/" + thread + "/checkpoints/" + url.PathEscape(put.ID) + "?" + url.Values{"checkpoint_ns": {ns}}.Encode()
	r := a.send(t, http.MethodGet, path, "", nil)
	var got struct {
		NS       string                     `json:"checkpoint_ns"`
		ParentID string                     `json:"parent_checkpoint_id"`
		State    []byte                     `json:"state"`
		Metadata map[string]json.RawMessage `json:"metadata"`
	}
	if r.Status != http.StatusOK || json.Unmarshal(r.Raw, &got) != nil {
		t.Fatalf("%q: put %s, read back %d %s", body, raw, r.Status, r.Raw)
	}
	var sent map[string]json.RawMessage
	_ = json.Unmarshal(metadata, &sent)
	if got.NS != ns || got.ParentID != parent || !bytes.Equal(got.State, state) || !sameFields(sent, got.Metadata) {
		t.Fatalf("%q: put, and read back %s", body, r.Raw)
	}
}

// sameFields reports whether two JSON objects' fields hold the same JSON
// values, numbers compared by value (numbers beyond float64 as written).
func sameFields(a, b map[string]json.RawMessage) bool {
	if len(a) != len(b) {
		return false
	}
	for k, va := range a {
		vb, ok := b[k]
		if !ok || !sameResult(va, vb) && !(string(va) == "null" && string(vb) == "null") {
			return false
		}
	}
	return true
}
