package keyspace

import (
	"fmt"
	"strconv"
	"strings"
)

// A lock contender's name, the last segment of its key under [Space.Lock],
// is "{lease:016x}-{random}-{slot}": the lease the key is bound to, in 16
// hex digits; a random part that tells lockers sharing one lease apart and
// makes the name a secret of its holder (the HTTP API releases by it); and
// a slot that tells one locker's concurrent contentions for a lock apart.

// ContenderPrefix is the start of every contender name of the locker that
// holds lease and drew random: "{lease:016x}-{random}-".
func ContenderPrefix(lease int64, random string) string {
	return fmt.Sprintf("%016x-%s-", lease, random)
}

// ContenderName is the name of a locker's contender in slot slot; prefix
// is the locker's [ContenderPrefix].
func ContenderName(prefix string, slot int) string { return prefix + strconv.Itoa(slot) }

// ContenderLease reads the lease a contender's name starts with; false when
// the part before its first '-' is not 16 hex digits.
func ContenderLease(contender string) (int64, bool) {
	h, _, _ := strings.Cut(contender, "-")
	n, err := strconv.ParseUint(h, 16, 64)
	if err != nil || len(h) != 16 {
		return 0, false
	}
	return int64(n), true
}

// ParseLockContender returns the lock name and the contender name of a key
// under [Space.Locks]; false when key is not a contender key of this
// namespace.
func (s Space) ParseLockContender(key string) (name, contender string, ok bool) {
	rest, ok := strings.CutPrefix(key, s.Locks())
	if !ok {
		return "", "", false
	}
	name, contender, ok = strings.Cut(rest, "/")
	if !ok || name == "" || contender == "" {
		return "", "", false
	}
	return name, contender, true
}

// IsTaskLock says whether lock name is a task runner's lock, a [TaskLock].
func IsTaskLock(name string) bool { return strings.HasPrefix(name, TaskLock("")) }
