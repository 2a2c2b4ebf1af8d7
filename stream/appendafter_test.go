package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/stream"
)

// TestAppendAfterGoesOnlyWhereNamed: events appended after a named last
// event are stored when the stream ends there, and refused (ErrMoved,
// nothing stored) when another write came first, even when that write
// went through another Writer, whose own view of the stream is stale:
// the check is the transaction's.
func TestAppendAfterGoesOnlyWhereNamed(t *testing.T) {
	t.Parallel()
	e := newEnv(t, stream.Limits{})
	other := stream.NewWriter(e.cli, e.keys, stream.Limits{}, time.Millisecond)
	ctx := context.Background()
	const id = "task-after"
	a := stream.Claim{Task: id, Attempt: 1, Fence: claimKey(t, e.cli, e.keys, id)}
	if _, _, err := e.w.AppendAfter(ctx, a, -1, []stream.Input{{Type: "log"}}); err == nil || errors.Is(err, stream.ErrMoved) {
		t.Fatalf("after -1: %v, want a refusal of the argument", err)
	}
	// Into the empty stream: its start (seq 1), then the event.
	first, last, err := e.w.AppendAfter(ctx, a, 0, []stream.Input{{Type: "log", Data: text(1)}})
	if err != nil || first != 2 || last != 2 {
		t.Fatalf("after 0 into an empty stream: %d..%d, %v; want 2..2", first, last, err)
	}
	if _, _, err := other.AppendAfter(ctx, a, 2, []stream.Input{{Type: "log", Data: text(2)}}); err != nil {
		t.Fatalf("after 2, through another writer: %v", err)
	}
	// Sent twice from one read (an answer lost, or two requests at once):
	// the second finds the stream moved, through either writer.
	for _, w := range []*stream.Writer{e.w, other} {
		if _, _, err := w.AppendAfter(ctx, a, 2, []stream.Input{{Type: "log", Data: text(2)}}); !errors.Is(err, stream.ErrMoved) {
			t.Fatalf("after 2 again: %v, want ErrMoved", err)
		}
	}
	// e.w last wrote at 2; other wrote 3: what e.w last saw is not what
	// it checks against, the stream as stored is.
	if _, _, err := e.w.AppendAfter(ctx, a, 2, []stream.Input{{Type: "log", Data: text(9)}}); !errors.Is(err, stream.ErrMoved) {
		t.Fatalf("a stale writer after 2: %v, want ErrMoved", err)
	}
	if first, last, err := e.w.AppendAfter(ctx, a, 3, []stream.Input{{Type: "log", Data: text(3)}, {Type: "log", Data: text(4)}}); err != nil || first != 4 || last != 5 {
		t.Fatalf("after 3: %d..%d, %v; want 4..5", first, last, err)
	}
	got := collect(t, e.hub, id, 1, 5)
	checkSeq(t, got, 1)
	for i, want := range []string{"", string(text(1)), string(text(2)), string(text(3)), string(text(4))} {
		if i > 0 && string(got[i].Data) != want {
			t.Fatalf("event %d holds %s, want %s: %+v", i+1, got[i].Data, want, got)
		}
	}
	// Nothing past them: the refused writes stored nothing.
	if n, err := e.hub.LastSeq(ctx, id); err != nil || n != 5 {
		t.Fatalf("last seq %d, %v; want 5", n, err)
	}
}
