package keyspace

import (
	"strconv"
	"strings"
)

// A task's stream (package stream) is kept in chunks, each the events one
// attempt flushed at once, under the task's keys:
//
//	/{ns}/tasks/{id}/stream/{first:012d}-{last:012d}  events first..last of task id's stream
//	/{ns}/stream-expiry/{due:019d}-{id}                 when task id's stream may be removed (its task ended, or it grew too old)
//
// Chunks sort in sequence order; a writer creates the chunk that starts
// at its next sequence number only while no chunk starts there
// ([Space.StreamChunkStart] is the prefix it compares).

// StreamChunks is the prefix of task id's stream chunks, ending in "/".
func (s Space) StreamChunks(id string) string { return s.Task(id) + "stream/" }

// StreamChunk is the key of the chunk of task id's stream that holds
// events first through last.
func (s Space) StreamChunk(id string, first, last int64) string {
	key, _ := StreamChunkAt(s.StreamChunks(id), first, last)
	return key
}

// StreamChunkStart is the prefix of every chunk of task id's stream that
// starts at sequence number first: at most one exists.
func (s Space) StreamChunkStart(id string, first int64) string {
	_, start := StreamChunkAt(s.StreamChunks(id), first, first)
	return start
}

// StreamChunkAt is the chunk key of events first through last under a
// stream's chunks prefix (Space.StreamChunks) and its start prefix
// (Space.StreamChunkStart), built in one string: a stream's writer makes
// one for every chunk it writes, so it keeps the prefix and calls this.
func StreamChunkAt(chunks string, first, last int64) (key, start string) {
	b := make([]byte, 0, len(chunks)+26)
	b = append(b, chunks...)
	b = appendSeq(b, first)
	b = append(b, '-')
	n := len(b)
	key = string(appendSeq(b, last))
	return key, key[:n]
}

// appendSeq appends n, at least 12 digits (zeros first), as %012d does.
func appendSeq(b []byte, n int64) []byte {
	var d [20]byte
	s := strconv.AppendInt(d[:0], n, 10)
	for i := len(s); i < 12; i++ {
		b = append(b, '0')
	}
	return append(b, s...)
}

// ParseStreamChunk reads a chunk key of task id's stream: the sequence
// numbers of its first and last events; false when key is not one.
func (s Space) ParseStreamChunk(id, key string) (first, last int64, ok bool) {
	rest, ok := strings.CutPrefix(key, s.StreamChunks(id))
	if !ok || len(rest) != 25 || rest[12] != '-' {
		return 0, 0, false
	}
	f, err1 := strconv.ParseInt(rest[:12], 10, 64)
	l, err2 := strconv.ParseInt(rest[13:], 10, 64)
	if err1 != nil || err2 != nil || f < 1 || l < f {
		return 0, 0, false
	}
	return f, l, true
}

// StreamExpiries is the prefix of the streams' expiry index, ending in
// "/": timed keys ([TimedKey]) of task ids.
func (s Space) StreamExpiries() string { return s.root + "stream-expiry/" }
