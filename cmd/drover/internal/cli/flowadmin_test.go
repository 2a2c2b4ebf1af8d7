package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestFlowAdministration: set, delete and --json for limits, quotas and
// breakers, and a worker whose --quota differs from etcd's says so.
func TestFlowAdministration(t *testing.T) {
	ns := etcdtest.Namespace(t)
	run := func(want int, args ...string) result {
		t.Helper()
		r := drover(t, append(etcdFlags(ns), args...)...)
		if r.code != want {
			t.Fatalf("drover %v: exit %d, want %d; %q %q", args, r.code, want, r.stdout, r.stderr)
		}
		return r
	}
	var out map[string]any
	decode := func(r result) map[string]any {
		t.Helper()
		out = nil
		if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
			t.Fatalf("%q: %v", r.stdout, err)
		}
		return out
	}
	if o := decode(run(0, "limits", "set", "api", "10/s", "--json")); o["name"] != "api" || o["per_second"] != 10.0 || o["burst"] != 10.0 {
		t.Fatalf("limits set --json: %v", o)
	}
	if o := decode(run(0, "quotas", "set", "tenant", "2", "--json")); o["limit"] != 2.0 {
		t.Fatalf("quotas set --json: %v", o)
	}
	if o := decode(run(0, "breakers", "set", "crm", "failures=3;cooldown=1m", "--json")); o["failures"] != 3.0 || o["cooldown"] != "1m0s" {
		t.Fatalf("breakers set --json: %v", o)
	}
	if o := decode(run(0, "breakers", "set", "crm", "cooldown=2m", "--json")); o["failures"] != 3.0 || o["cooldown"] != "2m0s" {
		t.Fatalf("breakers set keeps what is not given: %v", o)
	}
	run(2, "breakers", "set", "crm", "failures=0")
	run(2, "breakers", "set", "crm", "bogus=1")
	if o := decode(run(0, "breakers", "reset", "crm", "--json")); o["state"] != "closed" {
		t.Fatalf("breakers reset --json: %v", o)
	}
	// A worker whose flags differ from etcd's settings says so, for each.
	if r := run(0, "submit", "--queue", "q", "--type", "t"); !strings.Contains(r.stdout, "submitted 1") {
		t.Fatal(r.stdout)
	}
	r := run(0, "worker", "--queue", "q", "--handler", "noop", "--drain", "--quota", "tenant=5", "--breaker", "crm;failures=9", "--limit", "api=99/s")
	for _, want := range []string{"quota tenant is already configured in etcd, differently", "breaker crm is already configured in etcd, differently",
		"limit api is already configured in etcd, differently", "drover quotas set tenant K"} {
		if !strings.Contains(r.stderr, want) {
			t.Fatalf("worker stderr lacks %q:\n%s", want, r.stderr)
		}
	}
	for _, kind := range []string{"limits", "quotas", "breakers"} {
		name := map[string]string{"limits": "api", "quotas": "tenant", "breakers": "crm"}[kind]
		if o := decode(run(0, kind, "delete", name, "--json")); o["deleted"] != true {
			t.Fatalf("%s delete: %v", kind, o)
		}
		if r := run(1, kind, "delete", name); !strings.Contains(r.stderr, "no such "+strings.TrimSuffix(kind, "s")+" "+name+"; see drover "+kind+" list") {
			t.Fatalf("%s delete again: %q", kind, r.stderr)
		}
		if r := run(0, kind, "list"); !strings.Contains(r.stdout, "no ") {
			t.Fatalf("%s list after delete: %q", kind, r.stdout)
		}
	}
}
