package keyspace_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover/keyspace"
)

// TestFlowAndCheckpointKeysRoundTrip: keys of limits, quotas, breakers and
// checkpoints parse back to their parts.
func TestFlowAndCheckpointKeysRoundTrip(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	for _, c := range []struct{ key, prefix, name, part string }{
		{s.LimitConfig("openai"), s.Limits(), "openai", "config"},
		{s.LimitState("openai"), s.Limits(), "openai", keyspace.StatePart},
		{s.QuotaConfig("tenant"), s.Quotas(), "tenant", keyspace.ConfigPart},
		{s.BreakerConfig("crm"), s.Breakers(), "crm", keyspace.ConfigPart},
		{s.BreakerState("crm"), s.Breakers(), "crm", "state"},
		{s.QuotaGrant("tenant", "acme", 0x1f), s.Quotas(), "tenant", "grants/acme/1f"},
	} {
		name, part, ok := keyspace.SplitName(c.prefix, c.key)
		if !ok || name != c.name || part != c.part {
			t.Fatalf("%s split as %q %q %t", c.key, name, part, ok)
		}
	}
	if sub, ok := keyspace.GrantSubject("grants/acme/1f"); !ok || sub != "acme" {
		t.Fatalf("subject %q %t", sub, ok)
	}
	for _, tenant := range []string{"acme", "a/b", "a%2Fb", "é t", "100%"} {
		seg := keyspace.EscapeSubject(tenant)
		if strings.Contains(seg, "/") {
			t.Fatalf("tenant %q: segment %q", tenant, seg)
		}
		_, part, _ := keyspace.SplitName(s.Quotas(), s.QuotaGrant("tenant", seg, 1))
		if sub, ok := keyspace.GrantSubject(part); !ok || sub != tenant {
			t.Fatalf("tenant %q: grant subject %q %t", tenant, sub, ok)
		}
	}
	if _, ok := keyspace.GrantSubject("ledger/acme"); ok {
		t.Fatal("a ledger read as a grant")
	}
	if got := s.CheckpointKey("th", "", "c1"); got != "/ns/checkpoints/th/@/cp/c1" {
		t.Fatal(got)
	}
	if pre := s.CheckpointKeys("th", "sub"); pre != "/ns/checkpoints/th/sub/cp/" || !strings.HasPrefix(s.CheckpointKey("th", "sub", "c1"), pre) {
		t.Fatalf("checkpoint prefix %q", pre)
	}
	if got := s.CheckpointInterrupt("th"); got != "/ns/checkpoints/th/interrupt" {
		t.Fatal(got)
	}
	if got := s.CheckpointWrites("th", "sub", "c1"); got != "/ns/checkpoints/th/sub/writes/c1" {
		t.Fatal(got)
	}
	if s.CheckpointHead("th", "") != s.CheckpointBase("th", "")+"head" || s.CheckpointFence("th", "x") != s.CheckpointBase("th", "x")+"fence" {
		t.Fatal("head or fence outside the base")
	}
}

// TestBudgetKeys: a budget key with '/' is one segment of its keys, and
// reads back from them.
func TestBudgetKeys(t *testing.T) {
	s := keyspace.MustNew("ns")
	const key = "openai/gpt-4.1/key-prod"
	if got := s.BudgetConfig(key); got != "/ns/budgets/config/openai%2Fgpt-4.1%2Fkey-prod" {
		t.Fatalf("config key %s", got)
	}
	for _, prefix := range []string{s.BudgetConfigs(), s.BudgetStates()} {
		if k, ok := keyspace.BudgetOf(prefix, prefix+keyspace.EscapeBudget(key)); !ok || k != key {
			t.Fatalf("%s read back as %q %t", prefix, k, ok)
		}
	}
	if _, ok := keyspace.BudgetOf(s.BudgetConfigs(), s.BudgetReservation(key, "id")); ok {
		t.Fatal("a reservation's key read as a budget's configuration")
	}
	if got := s.BudgetReservation(key, "ab12"); got != "/ns/budgets/res/openai%2Fgpt-4.1%2Fkey-prod/ab12" {
		t.Fatalf("reservation key %s", got)
	}
}
