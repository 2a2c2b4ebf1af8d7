package keyspace_test

import (
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
