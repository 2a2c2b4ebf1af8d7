package keyspace_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

// nameByte is the rule of keyspace.NameRule, one byte at a time, written
// apart from the code it checks.
func nameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("._-:", c) >= 0
}

// wantName says whether s is a name by the rule keyspace.NameRule states.
func wantName(s string) bool {
	if len(s) < 1 || len(s) > keyspace.MaxNameLen || s == "." || s == ".." {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !nameByte(s[i]) {
			return false
		}
	}
	return true
}

// FuzzName fuzzes the names and ids that become one key segment: queue,
// lock, task, thread and component names, task ids and namespaces, all
// checked by keyspace.CheckName. A name is accepted exactly when
// keyspace.NameRule says so; a rejected one is an InputError naming its
// field. An accepted name round-trips through every key that embeds it
// (namespace, lock contender, endpoint, limit, timed and pending keys, a
// task's index value), and no key of it falls under another name's
// prefix. Any string, as a checkpoint namespace, maps to one key segment
// without '/' that parses back to it.
func FuzzName(f *testing.F) {
	for _, s := range []string{
		"q", "jobs", "task:42", "a.b_c-d:e", ".", "..", "...", "", "a/b", "a b", "é", "~YQ", "@", "-", ":",
		strings.Repeat("n", 128), strings.Repeat("n", 129), "parent:1|child:2", "\x00", "a\nb", "\xff",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		err := keyspace.CheckName("queue", s)
		if (err == nil) != wantName(s) {
			t.Fatalf("CheckName(%q) = %v, want accepted %t", s, err, wantName(s))
		}
		if err != nil {
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != "queue" || !strings.HasPrefix(err.Error(), "invalid queue ") ||
				!strings.HasSuffix(err.Error(), keyspace.NameRule) {
				t.Fatalf("CheckName(%q): %v does not name the field and the rule", s, err)
			}
			if _, nerr := keyspace.New(s); s != "" && nerr == nil {
				t.Fatalf("namespace %q accepted", s)
			}
		} else {
			nameKeys(t, s)
		}
		checkpointNS(t, s)
	})
}

// nameKeys checks that valid name s round-trips through the keys that
// embed it.
func nameKeys(t *testing.T, s string) {
	t.Helper()
	sp, err := keyspace.New(s)
	if err != nil || sp.Namespace() != s || sp.Root() != "/"+s+"/" {
		t.Fatalf("namespace %q: %v, %v", s, sp, err)
	}
	ns := keyspace.MustNew("ns")
	if name, ok := ns.LockName(ns.LockContender(s, "694d9a1b2c3d4e5f-x")); !ok || name != s {
		t.Fatalf("lock %q read back as %q %t", s, name, ok)
	}
	if c, id, ok := ns.EndpointOf(ns.Endpoint(s, s)); !ok || c != s || id != s {
		t.Fatalf("endpoint %q read back as %q %q %t", s, c, id, ok)
	}
	if name, part, ok := keyspace.SplitName(ns.Quotas(), ns.QuotaGrant(s, s, 0x1f)); !ok || name != s || part != "grants/"+s+"/1f" {
		t.Fatalf("quota grant %q read back as %q %q %t", s, name, part, ok)
	} else if sub, ok := keyspace.GrantSubject(part); !ok || sub != s {
		t.Fatalf("grant subject %q read back as %q %t", s, sub, ok)
	}
	at := time.Unix(0, 1763820000123456789)
	if tt, id, ok := keyspace.ParseTimedKey(ns.QueueRetry(s), ns.QueueRetryKey(s, at, s)); !ok || tt != at.UnixNano() || id != s {
		t.Fatalf("retry key of %q read back as %d %q %t", s, tt, id, ok)
	}
	p := keyspace.Pending{Shard: 7, Level: 1000, Submitted: at, ID: s}
	if got, ok := ns.ParsePendingKey(s, ns.PendingKey(s, p)); !ok || got.ID != s || got.Shard != 7 || got.Level != 1000 || !got.Submitted.Equal(at) {
		t.Fatalf("pending key of %q read back as %+v %t", s, got, ok)
	}
	place := keyspace.TaskPlace{Queue: s, Segment: keyspace.SegmentName(3, at, s), Slot: 99}
	if got, ok := keyspace.ParseTaskPlace(place.String()); !ok || got != place {
		t.Fatalf("task place %v read back as %v %t", place, got, ok)
	}
	if lv, got, ok := keyspace.ParseSegmentName(place.Segment); !ok || lv != 3 || !got.Equal(at) {
		t.Fatalf("segment %q read back as %d %v %t", place.Segment, lv, got, ok)
	}
	// No other name's keys fall under this name's prefix.
	for _, other := range []string{s + "x", s + ".", s + "-1"} {
		if strings.HasPrefix(ns.Lock(other), ns.Lock(s)) || strings.HasPrefix(ns.Queue(other), ns.Queue(s)) {
			t.Fatalf("the keys of %q fall under those of %q", other, s)
		}
	}
}

// checkpointNS checks that any string, as a checkpoint namespace, maps to
// one key segment that parses back to it.
func checkpointNS(t *testing.T, s string) {
	t.Helper()
	name := keyspace.CheckpointNSName(s)
	seg := keyspace.CheckpointNS(name)
	if seg == "" || strings.Contains(seg, "/") {
		t.Fatalf("checkpoint namespace %q: segment %q", s, seg)
	}
	if got, ok := keyspace.ParseCheckpointNS(seg); !ok || got != s {
		t.Fatalf("checkpoint namespace %q: segment %q read back as %q %t", s, seg, got, ok)
	}
	ns := keyspace.MustNew("ns")
	if got, ok := ns.CheckpointNSOfKey("th", ns.CheckpointHead("th", name)); !ok || got != s {
		t.Fatalf("checkpoint namespace %q: head key read back as %q %t", s, got, ok)
	}
	// A segment that parses is the canonical one of what it parses to.
	if got, ok := keyspace.ParseCheckpointNS(s); ok && keyspace.CheckpointNS(keyspace.CheckpointNSName(got)) != s {
		t.Fatalf("segment %q parsed as %q, whose segment is %q", s, got, keyspace.CheckpointNS(keyspace.CheckpointNSName(got)))
	}
}
