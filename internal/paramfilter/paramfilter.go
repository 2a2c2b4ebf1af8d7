// Package paramfilter matches a task's parameters (a JSON object) against
// key=value filters, as drover's task search gives them:
//
//	f := paramfilter.New("thread", "4411")
//	f.Match([]byte(`{"thread":4411}`))   // true
//	f.Match([]byte(`{"thread":"4411"}`)) // true: a string equal to the value as given
//
// A value that parses as JSON matches the same JSON value (a number the
// same number however written: 7, 7.0, 0.7e1); any value matches a string
// equal to it as given. Match first looks for the key and
// the value in the raw bytes, so that a scan parses only the objects that
// may match.
package paramfilter

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

// MaxFilters bounds the filters of a query, MaxValue a filter's value.
const (
	MaxFilters = 16
	MaxValue   = 1024
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

// Parse checks the key=value pairs of a query and returns their filters,
// sorted by key and value (a query's digest does not depend on their
// order). Bad input is an error naming the field "param".
func Parse(pairs [][2]string) ([]Filter, error) {
	if len(pairs) > MaxFilters {
		return nil, &drover.InputError{Field: "param", Value: len(pairs), Rule: fmt.Sprintf("at most %d parameter filters", MaxFilters)}
	}
	var fs []Filter
	for _, p := range pairs {
		if err := keyspace.CheckName("param", p[0]); err != nil {
			return nil, &drover.InputError{Field: "param", Value: p[0] + "=" + p[1], Rule: "its key " + keyspace.NameRule}
		}
		if len(p[1]) > MaxValue {
			return nil, &drover.InputError{Field: "param", Value: p[0], Rule: fmt.Sprintf("its value must be at most %d bytes", MaxValue)}
		}
		fs = append(fs, New(p[0], p[1]))
	}
	slices.SortFunc(fs, func(a, b Filter) int { return cmp.Or(cmp.Compare(a.Key, b.Key), cmp.Compare(a.Value, b.Value)) })
	return fs, nil
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
// lacks the quoted key, or a value that can only be written as given (not
// a number, an object or an array).
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
	case float64: // 7 may be written 7.0, 0.7e1, 7E0; 0 as -0: compared as numbers
		return true
	}
	return bytes.Contains(params, []byte(f.Value))
}
