package cli_test

import (
	"bytes"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestSubmitRejectsInvalidUTF8: text that is not UTF-8 is rejected with its
// line and field; it used to be stored and given back as JSON that other
// languages cannot decode.
func TestSubmitRejectsInvalidUTF8(t *testing.T) {
	ns := etcdtest.Namespace(t)
	in := []byte("{\"task_id\":\"ok-1\",\"task_type\":\"t\"}\n" +
		"{\"task_id\":\"bad-1\",\"task_type\":\"t\",\"parameters\":{\"x\":\"\xff\xfe\"}}\n" +
		"{\"task_id\":\"bad-2\",\"task_type\":\"t\",\"input_data_uri\":\"s3://\xc3\"}\n" +
		"{\"task_id\":\"ok-2\",\"task_type\":\"t\"}\n")
	r := droverIn(t, in, append(etcdFlags(ns), "submit", "--queue", "u", "--file", "-")...)
	if r.code != 65 || !strings.Contains(r.stdout, "submitted 2, duplicates 0, rejected 2") ||
		!strings.Contains(r.stderr, "line 2: not UTF-8 text") || !strings.Contains(r.stderr, "line 3: not UTF-8 text") {
		t.Fatalf("exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, append(etcdFlags(ns), "tasks", "get", "bad-1")...); r.code != 1 {
		t.Fatalf("bad-1 was stored: %d %q", r.code, r.stdout)
	}
}

// TestSubmitStopsOnInputThatIsNotJSONL: random bytes, zeros, or many bad
// lines stop the submission at once with exit 65 and the counts; it used to
// grow past 1.3 GB, or run forever on /dev/zero.
func TestSubmitStopsOnInputThatIsNotJSONL(t *testing.T) {
	ns := etcdtest.Namespace(t)
	random := make([]byte, 8<<20)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range random {
		random[i] = byte(rng.IntN(256))
	}
	var bad strings.Builder
	bad.WriteString("{\"task_id\":\"first\",\"task_type\":\"t\"}\n")
	for range 5000 {
		bad.WriteString("not json\n")
	}
	for _, tc := range []struct {
		name, want string
		in         []byte
	}{
		{"random bytes", "the input is not JSONL", random},
		{"zeros", "the input is not JSONL", make([]byte, 4<<20)},
		{"one endless line", "runs past 1 MiB without a newline", bytes.Repeat([]byte("x"), 3<<20)},
		{"many bad lines", "more than 1000 lines rejected; stopped there: submitted 1", []byte(bad.String())},
	} {
		began := time.Now()
		r := droverIn(t, tc.in, append(etcdFlags(ns), "submit", "--queue", "junk", "--file", "-")...)
		// The bound only guards against reading the input to its end.
		if r.code != 65 || !strings.Contains(r.stderr, tc.want) || time.Since(began) > 60*time.Second {
			t.Fatalf("%s: exit %d after %s; stderr %.500q", tc.name, r.code, time.Since(began), r.stderr)
		}
		if strings.Count(r.stderr, "\n") > 1100 {
			t.Fatalf("%s: %d lines of errors", tc.name, strings.Count(r.stderr, "\n"))
		}
	}
}

// TestSubmitInputErrors covers the rest of what a submission refuses, each
// with the flag or field and exit 2 (flags) or 65 (lines).
func TestSubmitInputErrors(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	long := strings.Repeat("a", 10000)
	id128, id129 := strings.Repeat("i", 128), strings.Repeat("j", 129)
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"priority flag", []string{"submit", "--queue", "q", "--type", "t", "--priority", "5000"}, 2, "invalid --priority 5000: must be between 0 and 1000"},
		{"a directory", []string{"submit", "--queue", "q", "--file", dir}, 2, "is a directory: give a JSONL file"},
		{"a 10,000-character id", []string{"submit", "--queue", "q", "--type", "t", "--id", long}, 2, "(10000 bytes)"},
		{"a 129-character id", []string{"submit", "--queue", "q", "--type", "t", "--id", id129}, 2, "must be 1 to 128 characters"},
		{"a 128-character id", []string{"submit", "--queue", "q", "--type", "t", "--id", id128}, 0, "submitted 1"},
		{"max-output 0", []string{"worker", "--queue", "q", "--handler", "noop", "--max-output", "0"}, 2, "--max-output"},
		{"max-output -1", []string{"worker", "--queue", "q", "--handler", "noop", "--max-output", "-1"}, 2, "--max-output"},
		{"grace -1s", []string{"worker", "--queue", "q", "--handler", "noop", "--grace", "-1s"}, 2, "--grace"},
		{"timeout 0", []string{"worker", "--queue", "q", "--handler", "noop", "--timeout", "0"}, 2, "--timeout"},
		{"limit -5", []string{"tasks", "list", "--queue", "q", "--limit", "-5"}, 2, "--limit"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		out := r.stdout + r.stderr
		if r.code != tc.code || !strings.Contains(out, tc.want) || len(out) > 1000 {
			t.Fatalf("%s: exit %d, want %d with %q; output %.600q", tc.name, r.code, tc.code, tc.want, out)
		}
	}
	// A byte order mark, and Go type names that no longer leak.
	bom := filepath.Join(dir, "bom.jsonl")
	if err := os.WriteFile(bom, []byte("\xef\xbb\xbf{\"task_id\":\"bom-1\",\"task_type\":\"t\"}\n[1,2]\n{\"task_id\":\"x\",\"task_type\":\"t\",\"timeout\":[]}\n{\"task_id\":\"y\",\"task_type\":\"t\",\"max_retries\":\"3\"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := drover(t, append(etcdFlags(ns), "submit", "--queue", "q", "--file", bom)...)
	for _, want := range []string{"submitted 1, duplicates 0, rejected 3", "line 2: a task must be a JSON object, not an array",
		`line 3: field timeout: must be a duration such as "30s", or a number of seconds`, "line 4: field max_retries: must be a whole number, not a string"} {
		if !strings.Contains(r.stdout+r.stderr, want) {
			t.Fatalf("BOM file: exit %d, output %q; want %q", r.code, r.stdout+r.stderr, want)
		}
	}
	if strings.Contains(r.stderr, "queue.") {
		t.Fatalf("a Go type name in %q", r.stderr)
	}
}
