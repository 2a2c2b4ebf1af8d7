package keyspace_test

import (
	"testing"

	"github.com/droverhq/drover/keyspace"
)

// TestCheckpointThreadOfKey: every key of a thread names the thread; keys
// outside the checkpoints prefix, or without a valid thread segment, do
// not.
func TestCheckpointThreadOfKey(t *testing.T) {
	t.Parallel()
	s := keyspace.MustNew("ns")
	for _, key := range []string{s.CheckpointKey("a-b", "@", "c1"), s.CheckpointHead("a-b", keyspace.CheckpointNSName("x|y")), s.CheckpointInterrupt("a-b")} {
		if th, ok := s.CheckpointThreadOfKey(key); !ok || th != "a-b" {
			t.Fatalf("%s: %q %v", key, th, ok)
		}
	}
	if s.CheckpointThreads()+"a-b/" != s.Checkpoints("a-b") {
		t.Fatal("a thread's prefix is not under CheckpointThreads")
	}
	for _, key := range []string{"/other/checkpoints/a/@/head", s.CheckpointThreads() + "a", s.CheckpointThreads() + "a b/x", s.Locks() + "a/x"} {
		if th, ok := s.CheckpointThreadOfKey(key); ok {
			t.Fatalf("%s: %q", key, th)
		}
	}
}
