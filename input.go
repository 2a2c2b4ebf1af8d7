package drover

import (
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// ErrInvalidInput is matched (with errors.Is) by every error that rejects a
// caller's input before anything is written.
var ErrInvalidInput = errors.New("drover: invalid input")

// InputError says which field was wrong and which rule it broke. Nothing is
// written when an operation returns one.
type InputError struct {
	// Field names the input as the caller knows it: a Go field or parameter
	// name ("name", "ttl") or, from the command line, the flag ("--ttl").
	Field string
	// Value is the rejected value, printed with %q when it is a string.
	Value any
	// Rule is the rule the value broke, phrased as what it must be.
	Rule string
}

// maxEcho is how much of a rejected string value an error shows.
const maxEcho = 64

// Error implements error. A long string value is shown cut to its first 64
// bytes, with its length: the caller has the rest.
func (e *InputError) Error() string {
	switch v := e.Value.(type) {
	case string:
		if len(v) > maxEcho {
			cut := maxEcho
			for cut > 0 && !utf8.RuneStart(v[cut]) {
				cut--
			}
			return fmt.Sprintf("invalid %s %q… (%d bytes): %s", e.Field, v[:cut], len(v), e.Rule)
		}
		return fmt.Sprintf("invalid %s %q: %s", e.Field, v, e.Rule)
	case nil:
		return fmt.Sprintf("invalid %s: %s", e.Field, e.Rule)
	default:
		return fmt.Sprintf("invalid %s %v: %s", e.Field, v, e.Rule)
	}
}

// Is makes errors.Is(err, ErrInvalidInput) true for every InputError.
func (e *InputError) Is(target error) bool { return target == ErrInvalidInput }

// Renamed returns a copy of e whose Field is field. Command-line code uses it
// to report the flag a user typed instead of the Go parameter name.
func (e *InputError) Renamed(field string) *InputError {
	c := *e
	c.Field = field
	return &c
}

// Rename rewrites the field of an InputError inside err to field, and returns
// err unchanged when it holds none.
func Rename(err error, field string) error {
	var ie *InputError
	if errors.As(err, &ie) {
		return ie.Renamed(field)
	}
	return err
}

// CheckDuration returns an InputError unless min <= d <= max.
func CheckDuration(field string, d, min, max time.Duration) error {
	if d < min || d > max {
		return &InputError{Field: field, Value: d, Rule: fmt.Sprintf("must be between %s and %s", min, max)}
	}
	return nil
}
