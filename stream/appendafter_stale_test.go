package stream_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
)

// A writer whose cached view of the stream is behind (another writer
// appended since) must still take an AppendAfter that names the
// stream's real last event.
func TestAppendAfterStaleWriterNamesRealLast(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	other := stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond)
	ctx := context.Background()
	const id = "task-after-stale"
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	if _, _, err := e.w.AppendAfter(ctx, a, 0, []stream.Input{{Type: "log", Data: text(1)}}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := other.Append(ctx, a, []stream.Input{{Type: "log", Data: text(2)}}); err != nil {
		t.Fatal(err)
	}
	last, err := e.hub.LastSeq(ctx, id)
	if err != nil || last != 3 {
		t.Fatalf("last %d, %v", last, err)
	}
	for i := 0; i < 3; i++ {
		if _, _, err := e.w.AppendAfter(ctx, a, last, []stream.Input{{Type: "log", Data: text(3)}}); err != nil {
			t.Fatalf("try %d: after %d (the stream's real last) through a stale writer: %v", i, last, err)
		}
		last++
	}
}
