package paramfilter

import "testing"

func TestMatch(t *testing.T) {
	for _, tc := range []struct {
		name, key, value, params string
		want                     bool
	}{
		{"number", "n", "7", `{"n":7}`, true},
		{"number as string", "n", "7", `{"n":"7"}`, true},
		{"number other", "n", "7", `{"n":70}`, false},
		{"number in exponent form", "n", "100", `{"n":1e2}`, true},
		{"number with a fraction", "n", "7", `{"n":7.0}`, true},
		{"number wanted with a fraction", "n", "7.0", `{"n":7}`, true},
		{"number wanted in exponent form", "n", "1e2", `{"n":100}`, true},
		{"number wanted negative zero", "n", "-0", `{"n":0}`, true},
		{"number wanted other", "n", "7.0", `{"n":8}`, false},
		{"number wanted key missing", "n", "7.0", `{"m":7}`, false},
		{"string bare", "tag", "x", `{"tag":"x"}`, true},
		{"string quoted", "tag", `"x"`, `{"tag":"x"}`, true},
		{"string escaped", "tag", "A", `{"tag":"\u0041"}`, true},
		{"key escaped", "tag", "x", `{"t\u0061g":"x"}`, true},
		{"string other", "tag", "x", `{"tag":"y"}`, false},
		{"bool", "ok", "true", `{"ok":true}`, true},
		{"null", "v", "null", `{"v":null}`, true},
		{"object", "o", `{"a": 1}`, `{"o":{"a":1}}`, true},
		{"missing key", "colour", "red", `{"tag":"red"}`, false},
		{"key only in a value", "colour", "red", `{"x":"colour","y":"red"}`, false},
		{"nested is not top level", "a", "1", `{"o":{"a":1}}`, false},
		{"not an object", "a", "1", `[1]`, false},
		{"no parameters", "a", "1", ``, false},
	} {
		if got := New(tc.key, tc.value).Match([]byte(tc.params)); got != tc.want {
			t.Errorf("%s: %s=%s on %s = %v, want %v", tc.name, tc.key, tc.value, tc.params, got, tc.want)
		}
	}
}

// TestSameNumberOtherSpelling: a number wanted written otherwise than the
// parameters write it passes the raw-bytes pre-check whenever a full
// match would hold.
func TestSameNumberOtherSpelling(t *testing.T) {
	for _, tc := range []struct{ v, params string }{{"7.0", `{"n":7}`}, {"-0", `{"n":0}`}, {"1e2", `{"n":100}`}, {"7", `{"n":7.00}`}} {
		if f := New("n", tc.v); !f.mayMatch([]byte(tc.params)) {
			t.Errorf("n=%s: the pre-check passes over %s (the same JSON number)", tc.v, tc.params)
		}
	}
}
