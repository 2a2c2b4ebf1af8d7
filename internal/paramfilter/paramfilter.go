// Package paramfilter matches a task's parameters (a JSON object) against
// key=value filters, as drover's task search gives them:
//
//	f := paramfilter.New("thread", "4411")
//	f.Match([]byte(`{"thread":4411}`))   // true
//	f.Match([]byte(`{"thread":"4411"}`)) // true: a string equal to the value as given
//
// A value that parses as JSON matches the same JSON value; any value
// matches a string equal to it as given. Match first looks for the key and
// the value in the raw bytes, so that a scan parses only the objects that
// may match.
package paramfilter

import (
	"bytes"
	"encoding/json"
	"reflect"
	"strconv"
)

// Filter is one key=value filter.
type Filter struct {
	Key, Value string
	want       any // Value read as JSON
	isJSON     bool
	quotedKey  []byte
}

// New returns the filter key=value.
func New(key, value string) Filter {
	f := Filter{Key: key, Value: value, quotedKey: []byte(strconv.Quote(key))}
	f.isJSON = json.Unmarshal([]byte(value), &f.want) == nil
	return f
}

// Match reports whether params, a JSON object, holds the filter's key with
// its value.
func (f Filter) Match(params []byte) bool {
	if !f.mayMatch(params) {
		return false
	}
	var ps map[string]json.RawMessage
	if json.Unmarshal(params, &ps) != nil {
		return false
	}
	v, ok := ps[f.Key]
	if !ok {
		return false
	}
	var got any
	if json.Unmarshal(v, &got) != nil {
		return false
	}
	if s, ok := got.(string); ok && s == f.Value {
		return true
	}
	return f.isJSON && reflect.DeepEqual(got, f.want)
}

// mayMatch is false only when params cannot match: it has no escapes and
// lacks the quoted key, or a value that can only be written as given.
func (f Filter) mayMatch(params []byte) bool {
	if bytes.IndexByte(params, '\\') >= 0 {
		return true
	}
	if !bytes.Contains(params, f.quotedKey) {
		return false
	}
	switch f.want.(type) {
	case map[string]any, []any: // spacing and order may differ
		return true
	case float64: // 7 may be written 7.0 or 0.7e1
		if bytes.ContainsAny(params, "eE.") {
			return true
		}
	}
	return bytes.Contains(params, []byte(f.Value))
}
