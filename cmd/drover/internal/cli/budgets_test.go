package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestBudgets: set, get, list and delete a budget, with --json; bad flags
// exit 2 naming the flag, and nothing is written.
func TestBudgets(t *testing.T) {
	ns := etcdtest.Namespace(t)
	run := func(want int, args ...string) result {
		t.Helper()
		r := drover(t, append(etcdFlags(ns), args...)...)
		if r.code != want {
			t.Fatalf("drover %v: exit %d, want %d; %q %q", args, r.code, want, r.stdout, r.stderr)
		}
		return r
	}
	decode := func(r result, v any) {
		t.Helper()
		if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
			t.Fatalf("%q: %v", r.stdout, err)
		}
	}
	const key = "openai/gpt-4.1/key-prod"
	var b map[string]any
	decode(run(0, "budgets", "set", key, "--tokens", "30000", "--requests", "500", "--window", "2m",
		"--weight", "acme=1", "--weight", "globex=3", "--cap", "trial=2000", "--estimate", "summarize=1200", "--json"), &b)
	if b["key"] != key || b["tokens"] != 30000.0 || b["window_seconds"] != 120.0 || b["remaining"] != 30000.0 ||
		b["weights"].(map[string]any)["globex"] != 3.0 || b["caps"].(map[string]any)["trial"] != 2000.0 ||
		b["estimates"].(map[string]any)["summarize"] != 1200.0 {
		t.Fatalf("budgets set --json: %v", b)
	}
	if r := run(0, "budgets", "get", key); !strings.Contains(r.stdout, "30000 tokens and 500 requests per 2m0s") || !strings.Contains(r.stdout, "30000 remaining") ||
		!strings.Contains(r.stdout, "default estimates by task type: summarize=1200") {
		t.Fatalf("budgets get: %q", r.stdout)
	}
	for _, c := range []struct {
		args []string
		flag string
	}{
		{[]string{"--tokens", "10", "--weight", "acme=0"}, "--weight acme"},
		{[]string{"--tokens", "10", "--weight", "acme"}, "--weight"},
		{[]string{"--tokens", "-1"}, "--tokens"},
		{[]string{"--tokens", "10", "--window", "1500ms"}, "--window"},
		{[]string{"--tokens", "10", "--cap", "x=11"}, "--cap x"},
		{[]string{"--tokens", "10", "--estimate", "summarize=11"}, "--estimate summarize"},
		{[]string{"--tokens", "10", "--estimate", "summarize=0"}, "--estimate summarize"},
		{[]string{"--tokens", "10", "--estimate", "no spaces=1"}, "--estimate"},
		{[]string{"--tokens", "10", "--estimate", "summarize"}, "--estimate"},
	} {
		if r := run(2, append([]string{"budgets", "set", key}, c.args...)...); !strings.Contains(r.stderr, "invalid "+c.flag) {
			t.Fatalf("budgets set %v: %q, want an error naming %s", c.args, r.stderr, c.flag)
		}
	}
	if r := run(2, "budgets", "get", "no spaces"); !strings.Contains(r.stderr, "invalid KEY") {
		t.Fatalf("bad key: %q", r.stderr)
	}
	var list []map[string]any
	decode(run(0, "budgets", "list", "--json"), &list)
	if len(list) != 1 || list[0]["tokens"] != 30000.0 { // the refused sets wrote nothing
		t.Fatalf("budgets list --json: %v", list)
	}
	if r := run(0, "budgets", "list"); !strings.Contains(r.stdout, key) {
		t.Fatalf("budgets list: %q", r.stdout)
	}
	decode(run(0, "budgets", "delete", key, "--json"), &b)
	if b["deleted"] != true {
		t.Fatalf("budgets delete --json: %v", b)
	}
	if r := run(1, "budgets", "get", key); !strings.Contains(r.stderr, "see drover budgets list") {
		t.Fatalf("get after delete: %q", r.stderr)
	}
	if r := run(0, "budgets", "list"); !strings.Contains(r.stdout, "no budgets") {
		t.Fatalf("list after delete: %q", r.stdout)
	}
}

// TestServerServesBudgetGauges: a budget reserved over a server's HTTP API
// shows in that server's /metrics, read from etcd at the scrape.
func TestServerServesBudgetGauges(t *testing.T) {
	s := startAPIServer(t)
	const esc = "openai%2Fgpt-4.1%2Fkey-prod"
	s.call("PUT", "/v1/budgets/"+esc, map[string]any{"tokens": 1000, "window_seconds": 86400}, 200)
	s.call("POST", "/v1/budgets/"+esc+"/reserve", map[string]any{"tenant": "acme", "estimate": 300}, 201)
	fams := scrape(t, s.met)
	want := map[string]string{"budget": "openai/gpt-4.1/key-prod"}
	if got := sum(fams["drover_budget_reserved_tokens"], want); got != 300 {
		t.Fatalf("drover_budget_reserved_tokens = %v, want 300", got)
	}
	want["tenant"] = "acme"
	if got := sum(fams["drover_budget_tenant_reserved_tokens"], want); got != 300 {
		t.Fatalf("drover_budget_tenant_reserved_tokens = %v, want 300", got)
	}
}
