package httpapi_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/droverhq/drover/queue"
)

// submitTypes are the Content-Types a fuzzed submission is sent with.
var submitTypes = []string{"application/x-ndjson", "application/json", "", "application/jsonl; charset=utf-8",
	"application/x-jsonlines", "text/plain"}

// FuzzSubmitBody fuzzes the body of POST /v1/queues/{q}/tasks, as NDJSON
// (one task a line) and as a JSON array, through the real handler and the
// queue on etcd; kind picks the Content-Type. Each line or element is
// judged apart by queue.ParseLine and Task.Validate. NDJSON: every line
// they refuse is listed in rejected with its 1-based number and their
// error; blank lines are skipped; the other lines went in (submitted or
// duplicates) or are listed as a task_id taken with other content; more
// than 1,000 refused lines are a 400 listing them. Array: a body that is
// not one JSON array is a 400 at body; one refused element is a 400
// listing every refused position, and nothing goes in; else every element
// went in or is a task_id taken. Any other Content-Type is a 415.
func FuzzSubmitBody(f *testing.F) {
	a := newFuzzAPI(f)
	for _, s := range []string{
		`{"task_id":"a1","task_type":"echo"}`,
		"{\"task_id\":\"a2\",\"task_type\":\"echo\"}\n\n{\"task_id\":\"a3\",\"task_type\":\"echo\",\"parameters\":{\"n\":1}}\r\n",
		"\xef\xbb\xbf{\"task_id\":\"a4\",\"task_type\":\"x\"}\nnot json\n{\"task_id\":\"a5\",\"task_type\":\"bad type\"}\n",
		"{\"task_id\":\"a6\",\"task_type\":\"x\"}\n{\"task_id\":\"a6\",\"task_type\":\"y\"}\n{\"task_id\":\"a6\",\"task_type\":\"x\"}",
		`[{"task_id":"b1","task_type":"echo"},{"task_id":"b2","task_type":"echo","metadata":{"priority":3}}]`,
		`[{"task_id":"b3","task_type":"echo"},{"task_type":"echo"},{"task_id":"b4","task_type":"e","max_retries":-1}]`,
		`[]`, `[1 2]`, `[1,]`, `[`, `{}`, `null`, `[{"task_id":"b5","task_type":"x"}] []`, "", "\n\n",
		strings.Repeat("x\n", 1002),
	} {
		for kind := range 2 {
			f.Add(uint8(kind), []byte(s))
		}
	}
	f.Fuzz(func(t *testing.T, kind uint8, body []byte) {
		if len(body) > 64<<10 {
			return // lines stay far below the longest line a submission takes
		}
		ct := submitTypes[int(kind)%len(submitTypes)]
		ans := a.send(t, http.MethodPost, "/v1/queues/fuzz/tasks", ct, body)
		mt, _, _ := strings.Cut(ct, ";")
		switch mt {
		case "application/x-ndjson", "application/jsonl", "application/x-jsonlines":
			checkNDJSON(t, body, ans)
		case "application/json", "":
			checkArray(t, body, ans)
		default:
			if ans.Status != http.StatusUnsupportedMediaType {
				t.Fatalf("Content-Type %q: %d, want 415: %s", ct, ans.Status, ans.Raw)
			}
		}
	})
}

// judge is what ParseLine and Validate say of one line or element: ""
// when it is a valid task, else the error the submission must give.
func judge(line []byte) string {
	task, err := queue.ParseLine(line)
	if err == nil {
		err = task.Validate()
	}
	if err != nil {
		return err.Error()
	}
	return ""
}

// checkNDJSON checks the answer to an NDJSON body.
func checkNDJSON(t *testing.T, body []byte, ans answer) {
	t.Helper()
	var want []queue.LineError
	valid := 0
	for i, line := range bytes.Split(body, []byte("\n")) {
		line = bytes.TrimRight(line, "\r")
		if i == 0 {
			line = bytes.TrimPrefix(line, []byte("\xef\xbb\xbf"))
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if e := judge(line); e != "" {
			want = append(want, queue.LineError{Line: i + 1, Error: e})
		} else {
			valid++
		}
	}
	if len(want) > 1000 {
		if ans.Status != http.StatusBadRequest || len(ans.Prob.Lines) <= 1000 {
			t.Fatalf("%q: %d refused lines, answered %d with %d lines", body, len(want), ans.Status, len(ans.Prob.Lines))
		}
		return
	}
	res := submitResult(t, body, ans)
	checkRejected(t, body, res, want, valid)
}

// checkArray checks the answer to a JSON array body.
func checkArray(t *testing.T, body []byte, ans answer) {
	t.Helper()
	var elems []json.RawMessage
	if !bytes.HasPrefix(bytes.TrimLeft(body, " \t\r\n"), []byte("[")) || json.Unmarshal(body, &elems) != nil {
		wantBadAt(t, body, ans, "body")
		return
	}
	var want []queue.LineError
	for i, e := range elems {
		if msg := judge(e); msg != "" {
			want = append(want, queue.LineError{Line: i + 1, Error: msg})
		}
	}
	if len(want) > 0 {
		got := make([]queue.LineError, len(ans.Prob.Lines))
		for i, l := range ans.Prob.Lines {
			got[i] = queue.LineError{Line: l.Line, Error: l.Error}
		}
		if ans.Status != http.StatusBadRequest || !slices.Equal(got, want) {
			t.Fatalf("%q: %d, want 400 with lines %v: %s", body, ans.Status, want, ans.Raw)
		}
		for _, l := range want[:min(len(want), 20)] {
			if !ans.hasLocation(fmt.Sprintf("body[%d]", l.Line-1)) {
				t.Fatalf("%q: position %d not among the errors: %s", body, l.Line, ans.Raw)
			}
		}
		return
	}
	res := submitResult(t, body, ans)
	checkRejected(t, body, res, nil, len(elems))
}

// submitResult reads a submission's 200.
func submitResult(t *testing.T, body []byte, ans answer) queue.SubmitResult {
	t.Helper()
	var res queue.SubmitResult
	if ans.Status != http.StatusOK || json.Unmarshal(ans.Raw, &res) != nil {
		t.Fatalf("%q: %d, want 200: %s", body, ans.Status, ans.Raw)
	}
	return res
}

// checkRejected checks a submission's result against the refused lines
// want and the number of valid ones: rejected lists want, and task ids
// taken with other content, in line order; every valid line is counted
// once.
func checkRejected(t *testing.T, body []byte, res queue.SubmitResult, want []queue.LineError, valid int) {
	t.Helper()
	var refused, taken []queue.LineError
	for _, r := range res.Rejected {
		if slices.Contains(want, r) {
			refused = append(refused, r)
		} else if strings.HasPrefix(r.Error, "task_id ") {
			taken = append(taken, r)
		} else {
			t.Fatalf("%q: rejected line %d (%s), want only %v and task ids taken", body, r.Line, r.Error, want)
		}
	}
	if !slices.Equal(refused, want) && !(len(refused) == 0 && len(want) == 0) {
		t.Fatalf("%q: rejected %v, want %v", body, res.Rejected, want)
	}
	if !slices.IsSortedFunc(res.Rejected, func(x, y queue.LineError) int { return x.Line - y.Line }) {
		t.Fatalf("%q: rejected not in line order: %v", body, res.Rejected)
	}
	if res.Submitted+res.Duplicates+len(taken) != valid {
		t.Fatalf("%q: %d valid tasks; submitted %d, duplicates %d, taken %v", body, valid, res.Submitted, res.Duplicates, taken)
	}
}
