package stream_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
)

// TestWriterThroughAnInProcessClient: a Writer of a client whose KV is
// not the plain one over a connection (drover server's in-process
// client, whose KV the store guard's admission wraps) sends its batches
// through that KV, with the same chunks and fences as over gRPC.
func TestWriterThroughAnInProcessClient(t *testing.T) {
	t.Parallel()
	cli := srv.LocalClient(t)
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	w, hub := stream.NewWriter(cli, keys, stream.Limits{}, time.Millisecond), stream.NewHub(cli, keys)
	ctx := context.Background()
	const id = "local-1"
	c1 := claimKey(t, cli, keys, id)
	a1 := stream.Claim{Task: id, Attempt: 1, Worker: "w1", Fence: c1}
	for i := 1; i <= 3; i++ {
		if _, _, err := w.Append(ctx, a1, []stream.Input{{Type: "log", Data: text(i)}}); err != nil {
			t.Fatal(err)
		}
	}
	lose(t, cli, c1)
	if _, _, err := w.Append(ctx, a1, []stream.Input{{Type: "log", Data: text(4)}}); !errors.Is(err, stream.ErrFenced) {
		t.Fatalf("a write after the claim's loss: %v, want ErrFenced", err)
	}
	if err := w.Finish(ctx, id, "dead", "lost"); err != nil {
		t.Fatal(err)
	}
	evs := collect(t, hub, id, 1, 5)
	checkSeq(t, evs, 1)
	if evs[0].Type != stream.AttemptStarted || evs[4].Type != stream.Done {
		t.Fatalf("the stream holds %+v", evs)
	}
}
