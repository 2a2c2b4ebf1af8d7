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

// checkBucketBound fails unless every start in ts (sorted, seconds) kept
// within a token bucket of rate perSecond and burst that filled no earlier
// than since: the k-th start needs k tokens, and by time T the bucket has
// handed out at most burst + perSecond*(T-since). Load only delays starts,
// so the bound holds however busy the machine is; a limit that is not
// applied (or not shared) breaks it.
func checkBucketBound(t *testing.T, ts []float64, since float64, perSecond float64, burst int, what string) {
	t.Helper()
	for i, v := range ts {
		if allowed := float64(burst) + perSecond*(v-since) + 1; float64(i+1) > allowed {
			t.Fatalf("%s: start %d came %.2f s after the bucket could fill, when at most %.0f tokens were available", what, i+1, v-since, allowed)
		}
	}
}

// limitUsed reads the tokens limit name has handed out in total.
func limitUsed(t *testing.T, ns, name string) int64 {
	t.Helper()
	r := drover(t, append(etcdFlags(ns), "limits", "list", "--json")...)
	var rows []struct {
		Name string `json:"name"`
		Rate string `json:"rate"`
		Used int64  `json:"used"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &rows); err != nil {
		t.Fatalf("limits list: %q %v", r.stdout, err)
	}
	for _, row := range rows {
		if row.Name == name {
			return row.Used
		}
	}
	t.Fatalf("limits list has no %s: %s", name, r.stdout)
	return 0
}

// now is the wall clock in seconds, as the handler's `date +%s.%N` writes it.
func now() float64 { return float64(time.Now().UnixNano()) / 1e9 }

// TestRateLimitSharedByWorkers runs 300 tasks through three worker processes
// that share a 20/s limit: no task starts before the shared bucket holds a
// token for it (three separate 20/s limits would run them three times as
// fast), and the bucket counts every task. The exact rate is measured with
// an injected clock in package flow (TestLimiterRate).
func TestRateLimitSharedByWorkers(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "rl", "call", 300, "")
	log := filepath.Join(t.TempDir(), "starts")
	began := now()
	ws := startWorkers(t, ns, 3, "--queue", "rl", "--concurrency", "8", "--drain",
		"--limit", "api=20/s", "--handler", "exec:date +%s.%N >> "+log)
	waitWorkers(t, ws, 120*time.Second)
	ts := starts(t, log)
	if len(ts) != 300 {
		t.Fatalf("%d tasks ran, want 300", len(ts))
	}
	checkBucketBound(t, ts, began, 20, 20, "3 workers sharing 20/s")
	t.Logf("300 tasks, 3 workers, limit 20/s: %.2f/s after the burst", float64(len(ts)-21)/(ts[len(ts)-1]-ts[20]))
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

// TestRateLimitChangedAtRunTime: three workers started with --limit
// api=1000/s keep to the 40/s set in etcd before them; `limits set` lowers
// it to 10/s and, once each worker has logged the change, the bucket hands
// out no more than 10/s; raised to 1000/s, the rest drains. Every check is
// an upper bound on what the bucket handed out, which load cannot break;
// package flow checks the exact rates before and after a change with an
// injected clock (TestLimiterFollowsRateChange).
func TestRateLimitChangedAtRunTime(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "rl", "call", 400, "")
	set := func(rate string, burst int) {
		t.Helper()
		if r := drover(t, append(etcdFlags(ns), "limits", "set", "api", rate, "--burst", strconv.Itoa(burst))...); r.code != 0 {
			t.Fatal(r.stderr)
		}
	}
	began := now()
	set("40/s", 4)
	log := filepath.Join(t.TempDir(), "starts")
	ws := startWorkers(t, ns, 3, "--queue", "rl", "--concurrency", "8", "--drain",
		"--limit", "api=1000/s", "--handler", "exec:date +%s.%N >> "+log)
	waitFor(t, 60*time.Second, "40 tasks", func() bool { return len(starts(t, log)) >= 40 })
	checkBucketBound(t, starts(t, log), began, 40, 4, "etcd's 40/s against the flag's 1000/s")

	set("10/s", 4)
	waitFor(t, 60*time.Second, "every worker to log the change to 10/s", func() bool {
		for _, w := range ws {
			if !strings.Contains(w.stderr.String(), "rate=10/s") {
				return false
			}
		}
		return true
	})
	from := now()
	usedFrom := limitUsed(t, ns, "api")
	time.Sleep(2 * time.Second)
	usedTo := limitUsed(t, ns, "api")
	to := now()
	// The bucket holds at most its burst when the window opens; then 10/s.
	if took, allowed := usedTo-usedFrom, 4+10*(to-from)+1; float64(took) > allowed {
		t.Fatalf("after every worker took the change to 10/s, %d tokens in %.2f s (at most %.0f allowed)", took, to-from, allowed)
	} else {
		t.Logf("after the change to 10/s: %d tokens in %.2f s", took, to-from)
	}
	if started := len(starts(t, log)); started >= 400 {
		t.Fatalf("all %d tasks ran before the window closed: the limit was not applied", started)
	}

	set("1000/s", 100)
	waitWorkers(t, ws, 120*time.Second)
	if n := len(starts(t, log)); n != 400 {
		t.Fatalf("%d tasks ran, want 400", n)
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
