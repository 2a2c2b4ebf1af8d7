package checkpoint

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"strconv"

	"github.com/droverhq/drover"
)

// Metadata is a checkpoint's metadata: a JSON object of any keys and values,
// as LangGraph's (source, step, parents, writes, and the user's own keys).
//
// Source, Step and Writer give the common keys typed; Extra holds every
// other key with its JSON value. In JSON (MarshalJSON, UnmarshalJSON) the
// metadata is one flat object that round-trips unaltered: "source" and
// "writer" are read into Source and Writer when they are non-empty strings,
// "step" into Step when it is a non-zero integer, and any other value of
// these keys (a zero step, a string step, an empty source) stays in Extra.
// When writing, Source and Writer are written when non-empty and Step when
// non-zero, over Extra's value of the same key.
type Metadata struct {
	// Source is how the checkpoint was made: input, loop, update, fork.
	Source string
	// Step is the graph's step number (-1 for the input).
	Step int
	// Writer is who wrote it (a node, a worker).
	Writer string
	// Extra holds every other top-level key, its value as JSON.
	Extra map[string]json.RawMessage
}

// Fields returns the metadata as one JSON object: each top-level key and
// its value.
func (m Metadata) Fields() map[string]json.RawMessage {
	out := make(map[string]json.RawMessage, len(m.Extra)+3)
	for k, v := range m.Extra {
		out[k] = v
	}
	if m.Source != "" {
		out["source"], _ = json.Marshal(m.Source)
	}
	if m.Writer != "" {
		out["writer"], _ = json.Marshal(m.Writer)
	}
	if m.Step != 0 {
		out["step"] = json.RawMessage(strconv.Itoa(m.Step))
	}
	return out
}

// MetadataOf is the metadata of a JSON object's fields; the inverse of
// Metadata.Fields.
func MetadataOf(fields map[string]json.RawMessage) Metadata {
	var m Metadata
	for k, v := range fields {
		switch k {
		case "source", "writer":
			var s string
			if json.Unmarshal(v, &s) == nil && s != "" {
				if k == "source" {
					m.Source = s
				} else {
					m.Writer = s
				}
				continue
			}
		case "step":
			if n, err := strconv.Atoi(string(bytes.TrimSpace(v))); err == nil && n != 0 {
				m.Step = n
				continue
			}
		}
		if m.Extra == nil {
			m.Extra = map[string]json.RawMessage{}
		}
		m.Extra[k] = v
	}
	return m
}

// MarshalJSON writes the metadata as one flat JSON object.
func (m Metadata) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(m.Fields())
	if err != nil {
		return nil, fmt.Errorf("checkpoint: metadata: %w", err)
	}
	return b, nil
}

// UnmarshalJSON reads a JSON object (null is empty metadata).
func (m *Metadata) UnmarshalJSON(b []byte) error {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(b, &fields); err != nil {
		return fmt.Errorf("checkpoint: metadata must be a JSON object: %w", err)
	}
	*m = MetadataOf(fields)
	return nil
}

// encodeMetadata is m as the stores keep it, or an InputError naming a
// value that is not JSON.
func encodeMetadata(m Metadata) ([]byte, error) {
	b, err := json.Marshal(m)
	if err != nil {
		return nil, &drover.InputError{Field: "metadata", Value: fmt.Sprint(err), Rule: "every value must be valid JSON"}
	}
	return b, nil
}

// filter is ListOptions.Filter with its values as JSON.
type filter map[string]json.RawMessage

// newFilter checks and encodes f's values.
func newFilter(f map[string]any) (filter, error) {
	out := make(filter, len(f))
	for k, v := range f {
		b, err := json.Marshal(v)
		if err != nil {
			return nil, &drover.InputError{Field: "filter", Value: k, Rule: fmt.Sprintf("the value must be JSON: %v", err)}
		}
		out[k] = b
	}
	return out, nil
}

// matches reports whether m has every key of f with a deeply equal value.
func (f filter) matches(m Metadata) bool {
	if len(f) == 0 {
		return true
	}
	fields := m.Fields()
	for k, want := range f {
		got, ok := fields[k]
		if !ok || !jsonEqual(got, want) {
			return false
		}
	}
	return true
}

// jsonEqual reports whether two JSON values are deeply equal: objects by
// their keys, arrays in order, numbers by value (1 equals 1.0).
func jsonEqual(a, b json.RawMessage) bool {
	va, errA := decodeJSON(a)
	vb, errB := decodeJSON(b)
	return errA == nil && errB == nil && valueEqual(va, vb)
}

func decodeJSON(b []byte) (any, error) {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	err := d.Decode(&v)
	return v, err
}

func valueEqual(a, b any) bool {
	switch x := a.(type) {
	case map[string]any:
		y, ok := b.(map[string]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for k, v := range x {
			w, ok := y[k]
			if !ok || !valueEqual(v, w) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !valueEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	case json.Number:
		y, ok := b.(json.Number)
		if !ok {
			return false
		}
		rx, okx := new(big.Rat).SetString(string(x))
		ry, oky := new(big.Rat).SetString(string(y))
		return okx && oky && rx.Cmp(ry) == 0
	default: // string, bool, nil
		return a == b
	}
}
