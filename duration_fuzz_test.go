package drover_test

import (
	"errors"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/lease"
)

// FuzzDuration fuzzes durations as the command line and the HTTP API read
// them: time.ParseDuration (what --ttl, --wait and ?wait=10s go through),
// then the range checks drover applies (lease.CheckTTL for TTLs,
// drover.CheckDuration for the rest). An accepted duration prints as a
// string that parses back to the same value; a duration out of range is
// an InputError naming its field and the bounds; a string that is no
// duration is echoed by an InputError as valid UTF-8, cut to a bounded
// length, with the field in the text.
func FuzzDuration(f *testing.F) {
	for _, s := range []string{
		"10s", "500ms", "1h30m", "1.5s", "0", "-1s", "24h", "24h0m0.000000001s", "999ns", "1s", "2562047h47m16.854775807s",
		"-2562047h47m16.854775808s", "1e3s", "", " ", "10", "s", "1.s", ".5m", "+3h", "1µs", "1us", "\xff10s",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := time.ParseDuration(s)
		if err != nil {
			checkEcho(t, "--wait", s, "must be a duration such as 10s or 500ms")
			return
		}
		back, err := time.ParseDuration(d.String())
		if err != nil || back != d {
			t.Fatalf("%q parses to %v, whose text %q parses to %v (%v)", s, d, d.String(), back, err)
		}
		err = lease.CheckTTL("--ttl", d)
		in := d >= lease.MinTTL && d <= lease.MaxTTL
		if (err == nil) != in {
			t.Fatalf("CheckTTL(%v) = %v, want accepted %v", d, err, in)
		}
		if err != nil {
			checkRangeError(t, err, "--ttl", d, lease.MinTTL, lease.MaxTTL)
		}
		// The Paxos lock service's --request-timeout: a range that does
		// not start at zero or a whole second.
		lo, hi := 100*time.Millisecond, 10*time.Minute
		err = drover.CheckDuration("--request-timeout", d, lo, hi)
		if (err == nil) != (d >= lo && d <= hi) {
			t.Fatalf("CheckDuration(%v, %v, %v) = %v", d, lo, hi, err)
		}
		if err != nil {
			checkRangeError(t, err, "--request-timeout", d, lo, hi)
			checkRangeError(t, drover.Rename(err, "ttl"), "ttl", d, lo, hi)
		}
	})
}

// checkRangeError fails t unless err is an InputError of field whose text
// names the field, the value and both bounds.
func checkRangeError(t *testing.T, err error, field string, d, lo, hi time.Duration) {
	t.Helper()
	var ie *drover.InputError
	if !errors.As(err, &ie) || !errors.Is(err, drover.ErrInvalidInput) || ie.Field != field {
		t.Fatalf("%v: not an InputError of %s: %#v", d, field, err)
	}
	msg := err.Error()
	for _, want := range []string{"invalid " + field + " ", d.String(), lo.String(), hi.String()} {
		if !strings.Contains(msg, want) {
			t.Fatalf("error %q does not contain %q", msg, want)
		}
	}
}

// checkEcho fails t unless an InputError rejecting string value s names
// field and shows s as valid UTF-8, cut to a bounded length.
func checkEcho(t *testing.T, field, s, rule string) {
	t.Helper()
	msg := (&drover.InputError{Field: field, Value: s, Rule: rule}).Error()
	if !strings.HasPrefix(msg, "invalid "+field+" ") || !strings.HasSuffix(msg, ": "+rule) {
		t.Fatalf("error %q does not name %s and its rule", msg, field)
	}
	if !utf8.ValidString(msg) {
		t.Fatalf("error %q is not UTF-8", msg)
	}
	// %q of at most 64 bytes is at most 4 bytes a byte, and the length.
	if limit := len(field) + len(rule) + 4*64 + 64; len(msg) > limit {
		t.Fatalf("error of %d bytes for a %d-byte value: %q", len(msg), len(s), msg)
	}
}
