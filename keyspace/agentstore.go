package keyspace

import (
	"net/url"
	"strings"
)

// The Agent Server's store (LangGraph's namespaced items) keeps one key
// per item:
//
//	/{ns}/agent-server/store/{label}/{label}/.../{label}//{key}
//
// Each label of the item's namespace is path-escaped (so it has no '/'),
// and "//" ends the namespace: labels are never empty, so the first "//"
// is that one, and the item's key follows as it is. The items of one
// namespace are under [Space.AgentStoreNamespace] and those of every
// namespace that starts with some labels under [Space.AgentStorePrefix].

// AgentStore is the prefix of every item of the store.
func (s Space) AgentStore() string { return s.root + "agent-server/store/" }

// AgentStorePrefix is the prefix of the items of every namespace whose
// first labels are prefix (every item for none). The labels must not be
// empty.
func (s Space) AgentStorePrefix(prefix []string) string {
	var b strings.Builder
	b.WriteString(s.AgentStore())
	for _, l := range prefix {
		b.WriteString(url.PathEscape(l))
		b.WriteByte('/')
	}
	return b.String()
}

// AgentStoreNamespace is the prefix of the items of namespace ns exactly.
func (s Space) AgentStoreNamespace(ns []string) string { return s.AgentStorePrefix(ns) + "/" }

// AgentStoreItem is the key of item key of namespace ns.
func (s Space) AgentStoreItem(ns []string, key string) string {
	return s.AgentStoreNamespace(ns) + key
}

// ParseAgentStoreItem reads a key of [Space.AgentStoreItem] back into
// its namespace and key; false when k is not such a key of the space.
func (s Space) ParseAgentStoreItem(k string) (ns []string, key string, ok bool) {
	rest, ok := strings.CutPrefix(k, s.AgentStore())
	if !ok {
		return nil, "", false
	}
	path, key, ok := strings.Cut(rest, "//")
	if !ok || path == "" {
		return nil, "", false
	}
	for _, l := range strings.Split(path, "/") {
		label, err := url.PathUnescape(l)
		if err != nil || label == "" {
			return nil, "", false
		}
		ns = append(ns, label)
	}
	return ns, key, true
}
