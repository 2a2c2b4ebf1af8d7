package keyspace_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover/keyspace"
)

// TestCheckpointNSRoundTrip: every checkpoint namespace, LangGraph's
// subgraph paths with '|' and long or odd ones included, becomes one key
// segment that parses back to it; plain names keep their keys; no
// namespace's keys fall under another's prefix.
func TestCheckpointNSRoundTrip(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	nss := []string{"", "child", "child:1", "parent:1f0b|child:2a3c", "a|b", "@", ".", "..", "~", "~YQ", "a/b", "a b",
		"écho|ünï", strings.Repeat("n", 128), strings.Repeat("n", 129), strings.Repeat("agent:1f0b3f7e-0d3c-6a2e-8000-0123456789ab|", 20)}
	bases := map[string]string{}
	for _, ns := range nss {
		name := keyspace.CheckpointNSName(ns)
		seg := keyspace.CheckpointNS(name)
		if strings.Contains(seg, "/") || seg == "" {
			t.Fatalf("%q: segment %q", ns, seg)
		}
		if got, ok := keyspace.ParseCheckpointNS(seg); !ok || got != ns {
			t.Fatalf("%q: segment %q parsed as %q %t", ns, seg, got, ok)
		}
		for _, key := range []string{s.CheckpointKey("th", name, "c1"), s.CheckpointHead("th", name), s.CheckpointWrites("th", name, "c1"), s.CheckpointFence("th", name)} {
			if got, ok := s.CheckpointNSOfKey("th", key); !ok || got != ns {
				t.Fatalf("%q: key %q parsed as %q %t", ns, key, got, ok)
			}
			if _, ok := s.CheckpointNSOfKey("t", key); ok {
				t.Fatalf("%q: key %q read as thread t's", ns, key)
			}
		}
		bases[ns] = s.CheckpointBase("th", name)
	}
	for a, pa := range bases {
		for b, pb := range bases {
			if a != b && strings.HasPrefix(pb, pa) {
				t.Fatalf("namespace %q's keys (%s) fall under %q's (%s)", b, pb, a, pa)
			}
		}
	}
	if keyspace.CheckpointNSName("child:1") != "child:1" || s.CheckpointKey("th", keyspace.CheckpointNSName(""), "c") != "/ns/checkpoints/th/@/cp/c" {
		t.Fatal("plain namespaces changed keys")
	}
	for _, seg := range []string{"", "~", "~!!", "~Y2hpbGQ", "~YQ=", "a|b", "a b"} { // "~Y2hpbGQ" is "child", plain
		if ns, ok := keyspace.ParseCheckpointNS(seg); ok {
			t.Fatalf("segment %q parsed as %q", seg, ns)
		}
	}
	if _, ok := s.CheckpointNSOfKey("th", s.CheckpointInterrupt("th")); ok {
		t.Fatal("the interrupt key read as a namespace's")
	}
}
