package httpapi_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/httpapi"
)

// badBase64 are JSON strings that no base64 field takes: not base64, the
// URL alphabet, missing or extra padding, a space, line breaks (which
// base64.StdEncoding would skip), and the empty string.
var badBase64 = []string{`"not base64 secret!"`, `"ab-_"`, `"eA"`, `"eA="`, `"eA== "`, `"eA\n=="`, `"eA\r\n=="`, `""`}

// TestBase64InputRefused: a string that is not base64 in each base64 input
// (a put's state, a write's value in a put's parent_writes and in the
// writes route, a step's state, a spawning step's state) answers a 400
// problem at the field's location, with the rule and without the value,
// and writes nothing.
func TestBase64InputRefused(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	head := a.put("ok", map[string]any{"state": b64("x")}).want(t, 201).str("checkpoint_id")
	s := a.session(30)
	tok := a.claim("job", s, 200).num("token")
	routes := []struct {
		method, path, body, loc string
	}{
		{"POST", "/v1/threads/ok/checkpoints", `{"mode":"append","state":%s}`, "body.state"},
		{"POST", "/v1/threads/ok/checkpoints", `{"parent_checkpoint_id":"` + head + `","state":"eA==",` +
			`"parent_writes":[{"task_id":"t","writes":[{"channel":"c","value":"dg=="},{"channel":"c","value":%s}]}]}`,
			"body.parent_writes[0].writes[1].value"},
		{"POST", "/v1/threads/ok/checkpoints/" + head + "/writes", `{"task_id":"t","writes":[{"channel":"c","value":"dg=="},{"channel":"c","value":%s}]}`,
			"body.writes[1].value"},
		{"PUT", "/v1/agent-tasks/job/steps/1", `{"session":"` + s + `","token":` + fmt.Sprint(tok) + `,"state":%s}`, "body.state"},
		{"PUT", "/v1/agent-tasks/job/steps/1/spawn", `{"session":"` + s + `","token":` + fmt.Sprint(tok) + `,"state":%s,"children":[]}`, "body.state"},
	}
	before := a.keyCount()
	for _, r := range routes {
		for _, bad := range badBase64 {
			p := a.do(r.method, r.path, fmt.Sprintf(r.body, bad)).problem(t, 400)
			errs, _ := p.JSON["errors"].([]any)
			if len(errs) != 1 {
				t.Fatalf("%s %s with %s: want one error: %s", r.method, r.path, bad, p.Raw)
			}
			e := errs[0].(map[string]any)
			if _, hasValue := e["value"]; e["location"] != r.loc || hasValue || !strings.Contains(e["message"].(string), "base64.StdEncoding") {
				t.Errorf("%s %s with %s: want the rule at %s without the value: %s", r.method, r.path, bad, r.loc, p.Raw)
			}
			if bytes.Contains(p.Raw, []byte("secret")) {
				t.Errorf("%s %s: the answer repeats the value: %s", r.method, r.path, p.Raw)
			}
		}
	}
	if n := a.keyCount(); n != before {
		t.Fatalf("refused writes changed the keys: %d, then %d", before, n)
	}
}

// TestBase64InputRoundTrip: every byte value sent as base64 (escaped JSON
// too) in a put's state, its parent_writes and the writes route, and a
// step's state, reads back the same; a write's value may be null or absent
// (empty), a state may not be null.
func TestBase64InputRoundTrip(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	all := make([]byte, 256)
	for i := range all {
		all[i] = byte(i)
	}
	enc := base64.StdEncoding.EncodeToString(all)
	first := a.put("rt", map[string]any{"state": enc}).want(t, 201).str("checkpoint_id")
	if raw := a.do("GET", "/v1/threads/rt/checkpoints/"+first+"/state", nil).want(t, 200).Raw; !bytes.Equal(raw, all) {
		t.Fatalf("state read back: %x", raw)
	}
	// "e\u0041==" is "eA==" with an escape: the byte 'x'.
	body := `{"parent_checkpoint_id":"` + first + `","state":"e\u0041==","parent_writes":[{"task_id":"t","writes":[` +
		`{"channel":"all","value":"` + enc + `"},{"channel":"null","value":null},{"channel":"absent"}]}]}`
	second := a.do("POST", "/v1/threads/rt/checkpoints", body).want(t, 201).str("checkpoint_id")
	a.do("POST", "/v1/threads/rt/checkpoints/"+second+"/writes", `{"task_id":"u","writes":[{"channel":"v","value":"dg=="}]}`).want(t, 204)
	a.do("POST", "/v1/threads/rt/checkpoints", `{"mode":"append","state":null}`).problem(t, 400)

	var got struct {
		State  []byte `json:"state"`
		Writes []struct {
			TaskID  string `json:"task_id"`
			Channel string `json:"channel"`
			Value   []byte `json:"value"`
		} `json:"pending_writes"`
	}
	if err := json.Unmarshal(a.do("GET", "/v1/threads/rt/checkpoints/"+first, nil).want(t, 200).Raw, &got); err != nil ||
		len(got.Writes) != 3 || !bytes.Equal(got.Writes[0].Value, all) || len(got.Writes[1].Value) != 0 || len(got.Writes[2].Value) != 0 {
		t.Fatalf("parent_writes read back: %+v (%v)", got, err)
	}
	if err := json.Unmarshal(a.do("GET", "/v1/threads/rt/head", nil).want(t, 200).Raw, &got); err != nil ||
		string(got.State) != "x" || len(got.Writes) != 1 || string(got.Writes[0].Value) != "v" {
		t.Fatalf("head read back: %+v (%v)", got, err)
	}

	s := a.session(30)
	tok := a.claim("rt-job", s, 200).num("token")
	a.do("PUT", "/v1/agent-tasks/rt-job/steps/1", map[string]any{"session": s, "token": tok, "steps": 2, "state": enc}).want(t, 200)
	r := a.do("PUT", "/v1/agent-tasks/rt-job/steps/2/spawn", `{"session":"`+s+`","token":`+fmt.Sprint(tok)+`,"state":null,"children":[]}`)
	r.problem(t, 400)
	if st, err := base64.StdEncoding.DecodeString(a.do("GET", "/v1/agent-tasks/rt-job", nil).want(t, 200).str("state")); err != nil || !bytes.Equal(st, all) {
		t.Fatalf("step state read back: %x (%v)", st, err)
	}
}

// oldBase64 is the rule a []byte input had: huma's pattern, then
// encoding/json's decoding.
var oldBase64 = regexp.MustCompile(`^[a-zA-Z0-9+/_-]+=*$`)

// TestBase64InputTakesWhatBytesTook: for every string of up to four
// characters over base64's alphabet, the URL one, padding, a space and
// line breaks, and each of those after a valid group, Base64Input takes
// exactly the strings a []byte field took (huma's pattern and encoding/json),
// with the same bytes.
func TestBase64InputTakesWhatBytesTook(t *testing.T) {
	t.Parallel()
	alphabet := []string{"A", "g", "+", "/", "-", "_", "=", " ", "\n", "\r"}
	strs := []string{""}
	for n, from := 0, 0; n < 4; n++ {
		to := len(strs)
		for _, s := range strs[from:to] {
			for _, c := range alphabet {
				strs = append(strs, s+c)
			}
		}
		from = to
	}
	for _, s := range strs {
		for _, in := range []string{s, "QUJD" + s} {
			quoted, _ := json.Marshal(in)
			var old struct{ V []byte }
			oldOK := oldBase64.MatchString(in) && json.Unmarshal([]byte(`{"V":`+string(quoted)+`}`), &old) == nil
			var v httpapi.Base64Input
			if err := v.UnmarshalJSON(quoted); err != nil {
				t.Fatalf("%q: %v", in, err)
			}
			errs := v.Resolve(nil, huma.NewPathBuffer([]byte("body.state"), len("body.state")))
			if newOK := len(errs) == 0; newOK != oldOK || newOK && !bytes.Equal(v.Bytes(), old.V) {
				t.Fatalf("%q: taken %v (%x), before %v (%x)", in, newOK, v.Bytes(), oldOK, old.V)
			}
			if len(errs) == 1 && errs[0].(*huma.ErrorDetail).Location != "body.state" {
				t.Fatalf("%q: refused at %v", in, errs[0])
			}
		}
	}
}

// TestBase64InputEveryFieldChecked: a state of another JSON type before a
// bad value later in the body does not stop the body's check there: both
// are named, whatever their order.
func TestBase64InputEveryFieldChecked(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	writes := `"parent_writes":[{"task_id":"t","writes":[{"channel":"c","value":"bad!"}]}]`
	for _, body := range []string{`{"state":12,` + writes + `}`, `{` + writes + `,"state":12}`} {
		p := a.do("POST", "/v1/threads/order/checkpoints", body).problem(t, 400)
		errs, _ := p.JSON["errors"].([]any)
		locs := map[any]bool{}
		for _, e := range errs {
			locs[e.(map[string]any)["location"]] = true
		}
		if len(errs) != 2 || !locs["body.state"] || !locs["body.parent_writes[0].writes[0].value"] {
			t.Fatalf("%s: want both fields named: %s", body, p.Raw)
		}
	}
}
