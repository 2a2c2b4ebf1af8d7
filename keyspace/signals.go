package keyspace

import "strings"

// A step task's signals live under its own prefix (Space.Task), so that
// whatever removes a task (a purge, the retention of finished tasks)
// removes its signals with its checkpoint, in the same delete: the inbox
// of signals sent and not yet consumed, and a small tombstone per signal
// consumed, which keeps a retried send with the same idempotency key from
// being delivered twice.

// QueueWait is the prefix of queue q's waiting tasks, ending in "/": one
// key per task, {due}-{id}, due at the wait's timeout.
func (s Space) QueueWait(q string) string { return s.Queue(q) + "wait/" }

// TaskSignals is the prefix of task id's inbox of signals, ending in "/".
func (s Space) TaskSignals(id string) string { return s.Task(id) + "signals/in/" }

// TaskSignalName is the prefix of task id's signals named name that wait
// in its inbox, ending in "/".
func (s Space) TaskSignalName(id, name string) string { return s.TaskSignals(id) + name + "/" }

// TaskSignal is the inbox key of task id's signal name sent with
// idempotency key idem.
func (s Space) TaskSignal(id, name, idem string) string { return s.TaskSignalName(id, name) + idem }

// TaskSignalsSeen is the prefix of task id's consumed signals' tombstones,
// ending in "/".
func (s Space) TaskSignalsSeen(id string) string { return s.Task(id) + "signals/seen/" }

// TaskSignalSeen is the tombstone of task id's consumed signal name sent
// with idempotency key idem.
func (s Space) TaskSignalSeen(id, name, idem string) string {
	return s.TaskSignalsSeen(id) + name + "/" + idem
}

// ParseTaskSignal reads a key under prefix (TaskSignals or TaskSignalsSeen
// of a task) as a signal's name and idempotency key; false when it is not
// one.
func ParseTaskSignal(prefix, key string) (name, idem string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok {
		return "", "", false
	}
	name, idem, ok = strings.Cut(rest, "/")
	if !ok || !validName(name) || !validName(idem) {
		return "", "", false
	}
	return name, idem, true
}
