package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/lock"
)

// TestManyPendingWrites: one call with 1,280 pending writes (ten times
// etcd's 128 operations a request) is saved whole and read back in order; a
// second call at the same indexes changes nothing (insert-if-absent); a
// fenced-out call and an oversize one write nothing. A key per write made the first call fail with "too many
// operations in txn request".
func TestManyPendingWrites(t *testing.T) { eachStore(t, testManyPendingWrites) }

func testManyPendingWrites(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("0")}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	writes := func(n int, task, tag string) []checkpoint.Write {
		out := make([]checkpoint.Write, n)
		for i := range out {
			out[i] = checkpoint.Write{TaskID: task, Channel: fmt.Sprintf("ch-%04d", i), Value: []byte(tag + fmt.Sprint(i)), Idx: i}
		}
		return out
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(1280, "t1", "a"), token(5)); err != nil {
		t.Fatalf("1,280 writes: %v", err)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(3, "t0", "b"), token(5)); err != nil {
		t.Fatal(err)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(2, "t1", "c"), token(5)); err != nil {
		t.Fatal(err)
	}
	got, err := s.Writes(ctx, "th", "", cp.ID)
	if err != nil || len(got) != 1283 || got[1282].Idx != 1279 {
		t.Fatalf("%d writes, %v", len(got), err)
	}
	want := func(i int, task, value string) {
		t.Helper()
		if got[i].TaskID != task || string(got[i].Value) != value {
			t.Fatalf("write %d = %s %q, want %s %q", i, got[i].TaskID, got[i].Value, task, value)
		}
	}
	want(0, "t0", "b0")
	want(2, "t0", "b2")
	want(3, "t1", "a0") // kept: a write at an index >= 0 is never replaced
	want(4, "t1", "a1")
	want(5, "t1", "a2")
	want(1282, "t1", "a1279")
	// Fenced out: a lower token writes nothing.
	if err := s.PutWrites(ctx, "th", "", cp.ID, writes(1280, "t2", "x"), token(4)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("fenced-out call: %v", err)
	}
	if got, _ := s.Writes(ctx, "th", "", cp.ID); len(got) != 1283 {
		t.Fatalf("a fenced-out call wrote: %d writes", len(got))
	}
	if err := s.PutWrites(ctx, "th", "", "no-such-checkpoint", writes(2, "t1", "z"), token(5)); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("writes of a missing checkpoint: %v", err)
	}
}

// TestOversizePendingWrites: the etcd store refuses pending writes past
// 1 MiB for one checkpoint, naming the limit, and writes nothing.
func TestOversizePendingWrites(t *testing.T) {
	s, _ := newStore(t)
	ctx := context.Background()
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	big := []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte(strings.Repeat("v", 1<<20))}}
	err = s.PutWrites(ctx, "th", "", cp.ID, big, nil)
	if !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "at most 1048576 bytes") {
		t.Fatalf("oversize writes: %v", err)
	}
	if got, _ := s.Writes(ctx, "th", "", cp.ID); len(got) != 0 {
		t.Fatalf("oversize writes left %d writes", len(got))
	}
}
