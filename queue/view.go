package queue

import (
	"encoding/json"
	"unicode/utf8"
)

// View is how a task is shown to people and programs (drover tasks get
// --json, and every listing): the task as it is stored, except its result,
// which is a JSON value: the result itself when it is JSON, a JSON string
// when it is other UTF-8 text. A result of other bytes is in ResultBase64
// instead.
type View struct {
	*Task
	Result       json.RawMessage `json:"result,omitempty"`
	ResultBase64 []byte          `json:"result_base64,omitempty"`
}

// NewView returns the view of t.
func NewView(t *Task) View {
	v := View{Task: t}
	switch r := t.Result; {
	case len(r) == 0:
	case json.Valid(r):
		v.Result = r
	case utf8.Valid(r):
		v.Result, _ = json.Marshal(string(r))
	default:
		v.ResultBase64 = r
	}
	return v
}
