package checkpoint_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
)

// TestOversizePendingWrites: the etcd store refuses pending writes past
// 1 MiB for one checkpoint, naming the limit, and writes nothing.
func TestOversizePendingWrites(t *testing.T) {
	t.Parallel()
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
