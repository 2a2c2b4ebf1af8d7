package queue_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
)

// FuzzParseLine fuzzes one line of a JSONL submission (what `drover queue
// submit` and the NDJSON body of POST /v1/queues/{q}/tasks read) through
// queue.ParseLine and Task.Validate, and the same bytes as a task's
// duration (timeout, backoff_base, backoff_max). A rejected line gets an
// error of a known shape that names the field at fault, as the line spells
// it; a line that parses and validates encodes to JSON that parses back
// to the same task and validates the same way; a rule a parsed task breaks
// is an InputError naming its field. A duration is read as Go's duration
// text or as a number of seconds, never with its sign flipped.
func FuzzParseLine(f *testing.F) {
	for _, s := range []string{
		`{"task_id":"t1","task_type":"echo"}`,
		`{"task_id":"t-2","task_type":"llm.call","parameters":{"prompt":"hi <b>","n":[1,2.50,3e2]},"metadata":{"priority":7,"tenant":"acme","created_at":"2026-11-25T10:00:00+01:00"},"max_retries":5,"timeout":"1m30s","backoff_base":0.25}`,
		`{"task_id":"t3","task_type":"x","input_data_uri":"s3://b/k","output_data_uri":"s3://b/o","scheduled_at":"2026-11-25T10:00:00Z","queue":"other"}`,
		`{"task_id":"t4","task_type":"x","parameters":null,"max_retries":0}`,
		`{"task_id":"t5","task_type":"x","timeout":-1}`,
		`{"task_id":"t6","task_type":"x","timeout":1e10}`,
		`{"task_id":"t7","task_type":"x","metadata":{"priority":"high"}}`,
		`{"task_id":"t8","task_type":"bad/type"}`,
		`{"task_id":"t9","task_type":"x","Priority":1}`,
		`{"task_id":"t10","task_type":"x","current_status":"DEAD"}`,
		`{"task_type":"x"}`,
		`{"task_id":"t11","task_type":"x"} {"task_id":"t12"}`,
		`[{"task_id":"t13"}]`, `"task"`, `42`, `null`, `{`, `{"task_id":"t14","task_type":"x",}`,
		"{\"task_id\":\"t15\",\"task_type\":\"x\",\"parameters\":\"\xff\"}",
		`{"task_id":"t16","task_type":"x","parameters":"\ud800"}`,
		`{"TASK_ID":"t17","Task_Type":"x","timeout":"10"}`,
		`{"task_id":"t18","task_type":"x","max_retries":101}`,
		`{"task_id":"t19","task_type":"x","metadata":{"priority":1001}}`,
		`"1.5s"`, `2.5`, `-3`, `1e300`, `true`, `[1]`, `{}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		checkDurationJSON(t, line)
		task, err := queue.ParseLine(line)
		if err != nil {
			checkLineError(t, line, err)
			return
		}
		verr := task.Validate()
		if verr != nil {
			checkInputError(t, verr)
		}
		b, err := json.Marshal(task)
		if err != nil {
			if verr == nil {
				t.Fatalf("valid task of %q does not encode: %v", line, err)
			}
			return
		}
		again, err := queue.ParseLine(b)
		if err != nil {
			t.Fatalf("%q parsed, and its encoding %q is refused: %v", line, b, err)
		}
		if verr2 := again.Validate(); errText(verr2) != errText(verr) {
			t.Fatalf("%q validates as %v, its encoding %q as %v", line, verr, b, verr2)
		}
		if !sameTask(t, task, again) {
			t.Fatalf("%q parsed as %+v; its encoding %q as %+v", line, task, b, again)
		}
	})
}

// lineErrorShapes are the beginnings of every error queue.ParseLine gives.
var lineErrorShapes = []string{
	"not UTF-8 text: invalid bytes at byte ", "a task must be a JSON object, not ", "field ", "malformed JSON at byte ",
	"malformed task: ", "more than one JSON value on the line", "task_id is required: ",
	"current_status, attempt, token, transitions, result, retries_attempted, waiting_for and stream_settled are set by drover",
}

// checkLineError fails t unless err, ParseLine's rejection of line, has a
// known shape and names the field at fault as line spells it.
func checkLineError(t *testing.T, line []byte, err error) {
	t.Helper()
	msg := err.Error()
	shape := ""
	for _, s := range lineErrorShapes {
		if strings.HasPrefix(msg, s) {
			shape = s
			break
		}
	}
	if shape == "" || !utf8.ValidString(msg) {
		t.Fatalf("%q: error of no known shape: %q", line, msg)
	}
	var obj map[string]json.RawMessage
	if json.Unmarshal(line, &obj) != nil {
		return // not one JSON object: no field to name
	}
	switch shape {
	case "field ":
		path, _, _ := strings.Cut(strings.TrimPrefix(msg, "field "), ":")
		first, rest, nested := strings.Cut(path, ".")
		if !hasKeyFold(obj, first) {
			t.Fatalf("%q: error %q names field %q, not in the line", line, msg, first)
		}
		if nested && first == "metadata" {
			var md map[string]json.RawMessage
			if json.Unmarshal(lookupFold(obj, first), &md) == nil && !hasKeyFold(md, rest) {
				t.Fatalf("%q: error %q names field %q, not in the line's metadata", line, msg, path)
			}
		}
	case "malformed task: ":
		var name string
		if _, err := fmtSscanQuoted(msg, "malformed task: json: unknown field ", &name); err == nil {
			var md map[string]json.RawMessage
			_ = json.Unmarshal(lookupFold(obj, "metadata"), &md)
			if _, top := obj[name]; !top && md[name] == nil {
				t.Fatalf("%q: error %q names field %q, not in the line", line, msg, name)
			}
		}
	}
}

// fmtSscanQuoted reads the Go-quoted string after prefix in msg.
func fmtSscanQuoted(msg, prefix string, out *string) (int, error) {
	rest, ok := strings.CutPrefix(msg, prefix)
	if !ok {
		return 0, errors.New("no such prefix")
	}
	return 1, json.Unmarshal([]byte(rest), out)
}

// hasKeyFold reports whether obj has key k, matched as encoding/json
// matches field names (case-insensitively).
func hasKeyFold(obj map[string]json.RawMessage, k string) bool { return lookupFold(obj, k) != nil }

func lookupFold(obj map[string]json.RawMessage, k string) json.RawMessage {
	for key, v := range obj {
		if strings.EqualFold(key, k) {
			return v
		}
	}
	return nil
}

// checkInputError fails t unless err is an InputError whose text names its
// field.
func checkInputError(t *testing.T, err error) {
	t.Helper()
	var ie *drover.InputError
	if !errors.As(err, &ie) || ie.Field == "" || !strings.Contains(err.Error(), ie.Field) || !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("validation error %q is not an InputError naming its field", err)
	}
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// sameTask reports whether a and b are the same task: times the same
// instant and parameters the same JSON once compacted.
func sameTask(t *testing.T, a, b queue.Task) bool {
	t.Helper()
	if !a.Metadata.CreatedAt.Equal(b.Metadata.CreatedAt) || !a.ScheduledAt.Equal(b.ScheduledAt) {
		return false
	}
	a.Metadata.CreatedAt, b.Metadata.CreatedAt = time.Time{}, time.Time{}
	a.ScheduledAt, b.ScheduledAt = time.Time{}, time.Time{}
	a.Parameters, b.Parameters = canonicalJSON(t, a.Parameters), canonicalJSON(t, b.Parameters)
	return reflect.DeepEqual(a, b)
}

// canonicalJSON is raw compacted, with HTML characters escaped as
// json.Marshal writes them.
func canonicalJSON(t *testing.T, raw json.RawMessage) json.RawMessage {
	t.Helper()
	if raw == nil {
		return nil
	}
	var c, e bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		t.Fatalf("parameters %q: %v", raw, err)
	}
	json.HTMLEscape(&e, c.Bytes())
	return e.Bytes()
}

// checkDurationJSON reads b as a task's duration: Go's duration text, or
// a number of seconds. What reads is the value written, with its sign; what
// does not read is a *json.UnmarshalTypeError (which names the field).
func checkDurationJSON(t *testing.T, b []byte) {
	t.Helper()
	var d queue.Duration
	err := json.Unmarshal(b, &d)
	var s string
	var secs float64
	switch {
	case json.Unmarshal(b, &s) == nil:
		want, perr := time.ParseDuration(s)
		if (err == nil) != (perr == nil) || err == nil && time.Duration(d) != want {
			t.Fatalf("duration %s read as %v (%v), want %v (%v)", b, time.Duration(d), err, want, perr)
		}
	case json.Unmarshal(b, &secs) == nil:
		// Beyond about 292 years of nanoseconds the conversion would
		// overflow: such a number is refused.
		if math.Abs(secs) >= math.MaxInt64/float64(time.Second) {
			if err == nil {
				t.Fatalf("duration %s (%g s) accepted as %v: it overflows", b, secs, time.Duration(d))
			}
			return
		}
		if err != nil {
			t.Fatalf("duration %s (%g s) refused: %v", b, secs, err)
		}
		if secs > 0 && d < 0 || secs < 0 && d > 0 {
			t.Fatalf("duration %s (%g s) read as %v: the sign flipped", b, secs, time.Duration(d))
		}
	}
	if err != nil {
		var te *json.UnmarshalTypeError
		if !errors.As(err, &te) && json.Valid(b) {
			t.Fatalf("duration %s: %v is not a type error", b, err)
		}
		return
	}
	// What reads encodes to text that reads back the same.
	enc, err := json.Marshal(d)
	var back queue.Duration
	if err != nil || json.Unmarshal(enc, &back) != nil || back != d {
		t.Fatalf("duration %v encodes to %s (%v), which reads as %v", time.Duration(d), enc, err, time.Duration(back))
	}
}
