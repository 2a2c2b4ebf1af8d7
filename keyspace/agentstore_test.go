package keyspace_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/droverhq/drover/keyspace"
)

func TestAgentStoreItemRoundTrip(t *testing.T) {
	sp, err := keyspace.New("ns")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		ns  []string
		key string
	}{
		{[]string{"a"}, "k"},
		{[]string{"a", "b"}, "k/with//slashes"},
		{[]string{"a/b", "100%", "é ü"}, ""},
		{[]string{"x"}, "//"},
	}
	for _, c := range cases {
		k := sp.AgentStoreItem(c.ns, c.key)
		if !strings.HasPrefix(k, sp.AgentStoreNamespace(c.ns)) || !strings.HasPrefix(k, sp.AgentStorePrefix(c.ns[:1])) {
			t.Errorf("%q is not under its namespace's prefixes", k)
		}
		ns, key, ok := sp.ParseAgentStoreItem(k)
		if !ok || !reflect.DeepEqual(ns, c.ns) || key != c.key {
			t.Errorf("ParseAgentStoreItem(%q) = %q, %q, %v; want %q, %q", k, ns, key, ok, c.ns, c.key)
		}
	}
	// A namespace's items are not under a longer one's, nor under a sibling's that starts alike.
	if strings.HasPrefix(sp.AgentStoreItem([]string{"a"}, "k"), sp.AgentStorePrefix([]string{"a", "b"})) {
		t.Error("an item of [a] is under the prefix [a b]")
	}
	if strings.HasPrefix(sp.AgentStoreItem([]string{"ab"}, "k"), sp.AgentStorePrefix([]string{"a"})) {
		t.Error("an item of [ab] is under the prefix [a]")
	}
	if strings.HasPrefix(sp.AgentStoreItem([]string{"a", "b"}, "k"), sp.AgentStoreNamespace([]string{"a"})) {
		t.Error("an item of [a b] is among the items of [a]")
	}
	for _, bad := range []string{"/ns/agent-server/store/a/k", "/ns/agent-server/store//k", "/ns/agent-server/threads/x", "/ns/agent-server/store/%zz//k"} {
		if _, _, ok := sp.ParseAgentStoreItem(bad); ok {
			t.Errorf("ParseAgentStoreItem(%q) succeeded", bad)
		}
	}
}
