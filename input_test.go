package drover_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover"
)

// TestInputErrorCutsLongValues: a long rejected value is shown cut, with its
// length, and never cut inside a character.
func TestInputErrorCutsLongValues(t *testing.T) {
	long := strings.Repeat("é", 5000)
	msg := (&drover.InputError{Field: "name", Value: long, Rule: "must be short"}).Error()
	if len(msg) > 150 || !strings.Contains(msg, "(10000 bytes): must be short") || strings.ContainsRune(msg, '\uFFFD') {
		t.Fatalf("%q", msg)
	}
	if msg := (&drover.InputError{Field: "name", Value: "short", Rule: "r"}).Error(); msg != `invalid name "short": r` {
		t.Fatalf("%q", msg)
	}
}
