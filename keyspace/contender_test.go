package keyspace_test

import (
	"strings"
	"testing"

	"github.com/droverhq/drover/keyspace"
)

// TestContenderRoundTrip: a contender's name carries its locker's lease,
// which reads back from the name alone; its key reads back to the lock
// name and the contender name; one locker's names share its prefix.
func TestContenderRoundTrip(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	for _, lease := range []int64{1, 0x694d9a1f2b3c4d5e, 1<<63 - 1} {
		prefix := keyspace.ContenderPrefix(lease, "abc")
		for _, slot := range []int{0, 7, 123} {
			c := keyspace.ContenderName(prefix, slot)
			if !strings.HasPrefix(c, prefix) || strings.Contains(c, "/") {
				t.Fatalf("contender %q of prefix %q", c, prefix)
			}
			if got, ok := keyspace.ContenderLease(c); !ok || got != lease {
				t.Fatalf("lease of %q = %x %t, want %x", c, got, ok, lease)
			}
			key := s.LockContender("job", c)
			if name, got, ok := s.ParseLockContender(key); !ok || name != "job" || got != c {
				t.Fatalf("ParseLockContender(%q) = %q %q %t", key, name, got, ok)
			}
			if !strings.HasPrefix(key, s.LockContender("job", prefix)) {
				t.Fatalf("key %q is not under its locker's prefix", key)
			}
		}
	}
	if got := keyspace.ContenderName(keyspace.ContenderPrefix(0x1f, "r"), 2); got != "000000000000001f-r-2" {
		t.Fatalf("contender name %q", got)
	}
	for _, bad := range []string{"", "1f-r-0", "000000000000001g-r-0", "0000000000000001f-r-0", "-r-0"} {
		if l, ok := keyspace.ContenderLease(bad); ok {
			t.Fatalf("ContenderLease(%q) = %x", bad, l)
		}
	}
	for _, bad := range []string{"/ns/locks/job", "/ns/locks//x", "/other/locks/job/x", "/ns/locks/job/"} {
		if _, _, ok := s.ParseLockContender(bad); ok {
			t.Fatalf("ParseLockContender(%q) accepted a key that is not a contender key", bad)
		}
	}
}

// TestLockNames: the task runner's and the thread run's locks are told
// from other lock names.
func TestLockNames(t *testing.T) {
	t.Parallel()
	if !keyspace.IsTaskLock(keyspace.TaskLock("t1")) || keyspace.IsTaskLock(keyspace.ThreadLock("t1")) || keyspace.IsTaskLock("report") {
		t.Fatal("IsTaskLock")
	}
	if got := keyspace.ThreadLock("th"); got != "thread:th" {
		t.Fatalf("ThreadLock = %q", got)
	}
}
