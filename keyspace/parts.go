package keyspace

import (
	"fmt"
	"net/url"
	"strings"
)

// CheckpointNS is the key segment of checkpoint namespace ns ("" is "@").
func CheckpointNS(ns string) string {
	if ns == "" {
		return "@"
	}
	return ns
}

// CheckpointBase is the prefix of thread's checkpoints in checkpoint
// namespace ns, ending in "/": its head, fence, checkpoints and pending
// writes are under it.
func (s Space) CheckpointBase(thread, ns string) string {
	return s.Checkpoints(thread) + CheckpointNS(ns) + "/"
}

// CheckpointHead is the key naming the latest checkpoint of a thread.
func (s Space) CheckpointHead(thread, ns string) string { return s.CheckpointBase(thread, ns) + "head" }

// CheckpointFence is the key holding the highest fencing token a thread's
// writes were made under.
func (s Space) CheckpointFence(thread, ns string) string {
	return s.CheckpointBase(thread, ns) + "fence"
}

// CheckpointKeys is the prefix of a thread's checkpoints in checkpoint
// namespace ns, ending in "/": [Space.CheckpointKey] of each id is under
// it, in the byte order of the ids.
func (s Space) CheckpointKeys(thread, ns string) string { return s.CheckpointBase(thread, ns) + "cp/" }

// CheckpointKey is the key of checkpoint id of a thread.
func (s Space) CheckpointKey(thread, ns, id string) string { return s.CheckpointKeys(thread, ns) + id }

// CheckpointWrites is the key of the pending writes of checkpoint id of a
// thread.
func (s Space) CheckpointWrites(thread, ns, id string) string {
	return s.CheckpointBase(thread, ns) + "writes/" + id
}

// QuotaGrant is the key of the grant a worker holds under lease of quota
// name for subject.
func (s Space) QuotaGrant(name, subject string, lease int64) string {
	return fmt.Sprintf("%s%x", s.QuotaGrants(name, subject), lease)
}

// Limit, Quota and Breaker prefixes hold "{name}/{part}" keys; SplitName
// reads one: the name, and the part after it ("config", "state",
// "grants/{subject}/{lease}", ...). false when key is not under prefix.
func SplitName(prefix, key string) (name, part string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return "", "", false
	}
	name, part, ok = strings.Cut(rest, "/")
	return name, part, ok && name != ""
}

// The parts after a name under [Space.Limits], [Space.Quotas] and
// [Space.Breakers] that [SplitName] returns for their single keys.
const (
	// ConfigPart is the part of a limit's, quota's or breaker's settings.
	ConfigPart = "config"
	// StatePart is the part of a limit's token bucket or a breaker's state.
	StatePart = "state"
)

// EscapeSubject is the key segment of quota subject subject (a tenant, which
// may hold any character): path-escaped, so that it has no '/'.
func EscapeSubject(subject string) string { return url.PathEscape(subject) }

// GrantSubject is the subject of a quota key part "grants/{subject}/{lease}",
// unescaped as [EscapeSubject] wrote it (kept as is when it is not an
// escaped segment); false for other parts.
func GrantSubject(part string) (string, bool) {
	sub, ok := strings.CutPrefix(part, "grants/")
	if !ok {
		return "", false
	}
	subject, _, _ := strings.Cut(sub, "/")
	if s, err := url.PathUnescape(subject); err == nil {
		subject = s
	}
	return subject, true
}

// Limit is the prefix of rate limit name's keys, ending in "/".
func (s Space) Limit(name string) string { return s.Limits() + name + "/" }

// Quota is the prefix of quota name's keys, ending in "/".
func (s Space) Quota(name string) string { return s.Quotas() + name + "/" }

// Breaker is the prefix of breaker name's keys, ending in "/".
func (s Space) Breaker(name string) string { return s.Breakers() + name + "/" }
