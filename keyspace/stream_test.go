package keyspace_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/droverhq/drover/keyspace"
)

func TestStreamChunkKeysRoundTrip(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	k := s.StreamChunk("t-1", 7, 12)
	if k != "/ns/tasks/t-1/stream/000000000007-000000000012" {
		t.Fatalf("chunk key %q", k)
	}
	if !strings.HasPrefix(k, s.StreamChunkStart("t-1", 7)) || strings.HasPrefix(k, s.StreamChunkStart("t-1", 70)) {
		t.Fatalf("chunk start prefix does not name exactly the chunk")
	}
	f, l, ok := s.ParseStreamChunk("t-1", k)
	if !ok || f != 7 || l != 12 {
		t.Fatalf("parse %q = %d %d %v", k, f, l, ok)
	}
	for _, bad := range []string{s.StreamChunks("t-1") + "x", s.StreamChunk("t-2", 1, 1), s.StreamChunks("t-1") + "000000000009-000000000008"} {
		if _, _, ok := s.ParseStreamChunk("t-1", bad); ok {
			t.Errorf("parse %q: accepted", bad)
		}
	}
}

// TestStreamChunkAtIsTheDocumentedLayout: the chunk key and its start,
// built in one string for the stream writer, follow the layout
// {first:012d}-{last:012d}, past 12 digits too.
func TestStreamChunkAtIsTheDocumentedLayout(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("t")
	chunks := s.StreamChunks("task-1")
	for _, seq := range [][2]int64{{1, 1}, {7, 42}, {999999999999, 1000000000000}, {1234567890123, 1234567890124}} {
		key, start := keyspace.StreamChunkAt(chunks, seq[0], seq[1])
		if want := fmt.Sprintf("%s%012d-%012d", chunks, seq[0], seq[1]); key != want || s.StreamChunk("task-1", seq[0], seq[1]) != want {
			t.Fatalf("chunk key %q (StreamChunk %q), want %q", key, s.StreamChunk("task-1", seq[0], seq[1]), want)
		}
		if want := fmt.Sprintf("%s%012d-", chunks, seq[0]); start != want || s.StreamChunkStart("task-1", seq[0]) != want {
			t.Fatalf("chunk start %q (StreamChunkStart %q), want %q", start, s.StreamChunkStart("task-1", seq[0]), want)
		}
	}
}
