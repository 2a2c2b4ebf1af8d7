package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// submitN submits n tasks of type typ to queue q through a JSONL file.
func submitN(t *testing.T, ns, q, typ string, n int, extra string) {
	t.Helper()
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, `{"task_id":"%s-%04d","task_type":"%s"%s}`+"\n", typ, i, typ, extra)
	}
	f := filepath.Join(t.TempDir(), "tasks.jsonl")
	if err := os.WriteFile(f, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	if r := drover(t, append(etcdFlags(ns), "submit", "--queue", q, "--file", f)...); r.code != 0 {
		t.Fatalf("submit: %s", r.stderr)
	}
}

// starts reads the start times the handler appended to path.
func starts(t *testing.T, path string) []float64 {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []float64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		v, err := strconv.ParseFloat(strings.TrimSpace(sc.Text()), 64)
		if err == nil {
			out = append(out, v)
		}
	}
	sort.Float64s(out)
	return out
}

// rateBetween is the rate of starts in [from, to).
func rateBetween(ts []float64, from, to float64) float64 {
	n := 0
	for _, v := range ts {
		if v >= from && v < to {
			n++
		}
	}
	return float64(n) / (to - from)
}

// TestRateLimitSharedByWorkers runs 300 tasks through three worker processes
// that share a 20/s limit: the measured rate after the initial burst is
// within 10 % of 20/s.
func TestRateLimitSharedByWorkers(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "rl", "call", 300, "")
	log := filepath.Join(t.TempDir(), "starts")
	ws := startWorkers(t, ns, 3, "--queue", "rl", "--concurrency", "8", "--drain",
		"--limit", "api=20/s", "--handler", "exec:date +%s.%N >> "+log)
	waitWorkers(t, ws, 60*time.Second)
	ts := starts(t, log)
	if len(ts) != 300 {
		t.Fatalf("%d tasks ran, want 300", len(ts))
	}
	burst := 20
	rate := float64(len(ts)-1-burst) / (ts[len(ts)-1] - ts[burst])
	t.Logf("300 tasks, 3 workers, limit 20/s: %.2f/s after the burst of %d", rate, burst)
	if rate < 18 || rate > 22 {
		t.Fatalf("measured %.2f tasks/s under a 20/s limit shared by 3 workers; want 20 ± 10 %%", rate)
	}
	r := drover(t, append(etcdFlags(ns), "limits", "list", "--json")...)
	var rows []struct {
		Name  string `json:"name"`
		Rate  string `json:"rate"`
		Burst int64  `json:"burst"`
		Used  int64  `json:"used"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil || len(rows) != 1 {
		t.Fatalf("limits list: %q %v", r.stdout, err)
	}
	if rows[0].Name != "api" || rows[0].Rate != "20/s" || rows[0].Burst != 20 || rows[0].Used != 300 {
		t.Fatalf("limits list: %+v, want api 20/s burst 20 used 300", rows[0])
	}
}

// TestRateLimitChangedAtRunTime raises a limit from 10/s to 40/s while three
// workers run: within a second they follow the new rate.
func TestRateLimitChangedAtRunTime(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "rl", "call", 260, "")
	if r := drover(t, append(etcdFlags(ns), "limits", "set", "api", "10/s", "--burst", "4")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	log := filepath.Join(t.TempDir(), "starts")
	ws := startWorkers(t, ns, 3, "--queue", "rl", "--concurrency", "8", "--drain",
		"--limit", "api=1000/s", "--handler", "exec:date +%s.%N >> "+log)
	waitFor(t, 30*time.Second, "40 tasks at 10/s", func() bool { return len(starts(t, log)) >= 40 })
	if r := drover(t, append(etcdFlags(ns), "limits", "set", "api", "40/s", "--burst", "4")...); r.code != 0 {
		t.Fatal(r.stderr)
	}
	changed := float64(time.Now().UnixNano()) / 1e9
	waitWorkers(t, ws, 60*time.Second)
	ts := starts(t, log)
	before := rateBetween(ts, ts[8], changed-0.2)
	after := rateBetween(ts, changed+1, ts[len(ts)-1])
	t.Logf("10/s (etcd's setting, not the flag's 1000/s): %.1f/s; after the change to 40/s: %.1f/s", before, after)
	if before < 9 || before > 11 {
		t.Fatalf("before the change %.1f/s, want 10 ± 10 %% (the limit in etcd wins over --limit)", before)
	}
	if after < 36 || after > 44 {
		t.Fatalf("from 1 s after the change %.1f/s, want 40 ± 10 %%", after)
	}
}

func TestLimitsBadInput(t *testing.T) {
	ns := etcdtest.Namespace(t)
	for _, tc := range []struct {
		args []string
		flag string
	}{
		{[]string{"limits", "set", "api", "fast"}, "RATE"},
		{[]string{"limits", "set", "api", "0/s"}, "RATE"},
		{[]string{"limits", "set", "a/b", "1/s"}, "NAME"},
		{[]string{"limits", "set", "api", "1/s", "--burst", "0"}, "--burst"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--limit", "api"}, "--limit"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--limit", "api=5/fortnight"}, "--limit"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--limit", "api=5/s;burst=x"}, "--limit"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--quota", "tenant"}, "--quota"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--quota", "tenant=0"}, "--quota"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--quota", "tenant=2;when=now"}, "--quota"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--breaker", "crm;failures=0"}, "--breaker"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--breaker", "crm;cooldown=soon"}, "--breaker"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--breaker", "a/b"}, "--breaker"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--breaker", "crm;ratio=2"}, "--breaker"},
		{[]string{"worker", "--queue", "q", "--handler", "noop", "--breaker", "crm;ratio=0.5;window=1ms"}, "--breaker"},
		{[]string{"breakers", "reset", "a/b"}, "NAME"},
		{[]string{"quotas", "set", "tenant", "many"}, "K"},
		{[]string{"quotas", "set", "tenant", "0"}, "K"},
		{[]string{"quotas", "set", "a/b", "2"}, "NAME"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.flag) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 naming %s", tc.args, r.code, r.stderr, tc.flag)
		}
	}
	if r := drover(t, append(etcdFlags(ns), "limits", "list", "--json")...); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("bad input created limits: %s", r.stdout)
	}
	if r := drover(t, append(etcdFlags(ns), "quotas", "list", "--json")...); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("bad input created quotas: %s", r.stdout)
	}
	if r := drover(t, append(etcdFlags(ns), "breakers", "list", "--json")...); strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("bad input created breakers: %s", r.stdout)
	}
}

// The list commands print tables a person can read (and "no ..." when
// there is nothing), the same rows as their --json.
func TestFlowListTables(t *testing.T) {
	ns := etcdtest.Namespace(t)
	for _, args := range [][]string{{"breakers", "list"}, {"limits", "list"}, {"quotas", "list"}} {
		r := drover(t, append(etcdFlags(ns), args...)...)
		if want := "no " + map[string]string{"breakers": "breakers", "limits": "rate limits", "quotas": "quotas"}[args[0]]; r.code != 0 || strings.TrimSpace(r.stdout) != want {
			t.Fatalf("%v on nothing: exit %d %q, want %q", args, r.code, r.stdout, want)
		}
	}
	for _, args := range [][]string{{"limits", "set", "api", "20/s", "--burst", "5"}, {"quotas", "set", "tenant", "4"}, {"quotas", "set", "tenant", "2", "--subject", "acme"}} {
		if r := drover(t, append(etcdFlags(ns), args...)...); r.code != 0 {
			t.Fatalf("%v: %s", args, r.stderr)
		}
	}
	r := drover(t, append(etcdFlags(ns), "limits", "list")...)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "LIMIT RATE BURST AVAILABLE USED" ||
		strings.Join(strings.Fields(lines[1]), " ") != "api 20/s 5 5.0 0" {
		t.Fatalf("limits list:\n%s", r.stdout)
	}
	r = drover(t, append(etcdFlags(ns), "quotas", "list")...)
	if lines := strings.Split(strings.TrimSpace(r.stdout), "\n"); len(lines) != 2 ||
		strings.Join(strings.Fields(lines[0]), " ") != "QUOTA LIMIT OWN LIMITS HELD" ||
		strings.Join(strings.Fields(lines[1]), " ") != "tenant 4 acme=2" {
		t.Fatalf("quotas list:\n%s", r.stdout)
	}
}
