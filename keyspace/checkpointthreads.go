package keyspace

import "strings"

// CheckpointThreads is the prefix of every thread's checkpoints, ending in
// "/": [Space.Checkpoints](thread) is CheckpointThreads() + thread + "/".
// Threads sort under it in the byte order of their id followed by "/".
func (s Space) CheckpointThreads() string { return s.root + "checkpoints/" }

// CheckpointThreadOfKey is the thread whose key under
// [Space.CheckpointThreads] key is; false for a key that is not under it or
// whose thread segment is not a valid name.
func (s Space) CheckpointThreadOfKey(key string) (string, bool) {
	rest, ok := strings.CutPrefix(key, s.CheckpointThreads())
	if !ok {
		return "", false
	}
	thread, _, ok := strings.Cut(rest, "/")
	if !ok || !validName(thread) {
		return "", false
	}
	return thread, true
}

// CheckpointInterrupt is the key that asks the run holding thread to stop
// for a newer one: a run watches it while it holds the thread, and a
// newer run admitted with the interrupt policy writes it (its value: when
// the request was made). It sits beside the thread's namespaces, and
// [Space.CheckpointNSOfKey] reads no namespace from it.
func (s Space) CheckpointInterrupt(thread string) string { return s.Checkpoints(thread) + "interrupt" }
