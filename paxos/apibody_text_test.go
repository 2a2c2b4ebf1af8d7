package paxos_test

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/droverhq/drover/paxos"
)

// replacedCases are JSON strings and whether encoding/json replaces part
// of them with U+FFFD (rather than the string spelling one).
var replacedCases = []struct {
	raw  string
	want bool
}{
	{`"plain"`, false},
	{`"\ufffd"`, false},
	{`"\uFFFD"`, false},
	{"\"\uFFFD\"", false},
	{`"\ud83d\ude00 and \ufffd"`, false},
	{`"\ud800"`, true},
	{`"\udc00"`, true},
	{`"a\ud800b"`, true},
	{`"\ud800\u0041"`, true},
	{`"\ud800\ud800\udc00"`, true},
	{`"\ud800\\"`, true},
	// An escaped backslash followed by "ufffd" is text, not an escape:
	// it spells no U+FFFD, so the lone surrogate after it is one.
	{`"\\ufffd\ud800"`, true},
	{`"\\\ufffd"`, false},
	{`"\\\\ud800\ufffd"`, false},
	{`"\\ud800\ufffd"`, false},
	{"\"w\xff\"", true},
	{"\"\xed\xa0\x80\"", true},
}

// TestReplacedInvalidText checks the table, each case against what
// encoding/json decodes.
func TestReplacedInvalidText(t *testing.T) {
	for _, tc := range replacedCases {
		var s string
		if err := json.Unmarshal([]byte(tc.raw), &s); err != nil {
			t.Fatalf("%s: %v", tc.raw, err)
		}
		if got := paxos.ReplacedInvalidText(s, []byte(tc.raw)); got != tc.want {
			t.Errorf("ReplacedInvalidText(%q, %s) = %v, want %v", s, tc.raw, got, tc.want)
		}
	}
}

// FuzzReplacedInvalidText compares ReplacedInvalidText with a decoder of
// its own: encoding/json replaced something exactly when the raw string
// is not UTF-8 or one of its \u escapes is an unpaired surrogate.
func FuzzReplacedInvalidText(f *testing.F) {
	for _, tc := range replacedCases {
		f.Add(tc.raw)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		var s string
		if json.Unmarshal([]byte(raw), &s) != nil || !strings.HasPrefix(raw, `"`) {
			return
		}
		want := strings.ContainsRune(s, utf8.RuneError) && replacedByDecoding(raw)
		if got := paxos.ReplacedInvalidText(s, []byte(raw)); got != want {
			t.Fatalf("ReplacedInvalidText(%q, %s) = %v, want %v", s, raw, got, want)
		}
	})
}

// replacedByDecoding decodes the valid JSON string raw escape by escape
// and reports whether any part of it decodes to U+FFFD it does not
// spell.
func replacedByDecoding(raw string) bool {
	if !utf8.ValidString(raw) {
		return true
	}
	var units []uint16 // the \u escapes in a row
	flush := func() bool {
		for i := 0; i < len(units); i++ {
			u := rune(units[i])
			if !utf16.IsSurrogate(u) {
				continue
			}
			if u < 0xdc00 && i+1 < len(units) && units[i+1] >= 0xdc00 && units[i+1] <= 0xdfff {
				i++
				continue
			}
			return true
		}
		units = units[:0]
		return false
	}
	body := raw[1 : len(raw)-1]
	for i := 0; i < len(body); i++ {
		if body[i] != '\\' {
			if flush() {
				return true
			}
			continue
		}
		if body[i+1] != 'u' {
			if flush() {
				return true
			}
			i++
			continue
		}
		var u uint16
		for _, c := range body[i+2 : i+6] {
			u <<= 4
			switch {
			case c <= '9':
				u |= uint16(c - '0')
			case c >= 'a':
				u |= uint16(c-'a') + 10
			default:
				u |= uint16(c-'A') + 10
			}
		}
		units = append(units, u)
		i += 5
	}
	return flush()
}
