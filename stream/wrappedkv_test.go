package stream_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// countingKV counts the transactions sent through it to the KV it wraps.
type countingKV struct {
	clientv3.KV
	txns atomic.Int64
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	k.txns.Add(1)
	return k.KV.Txn(ctx)
}

// TestWriterThroughAWrappedKVOverGRPC: a Writer of a client connected
// over gRPC whose KV is wrapped (drover server's store guard admission
// over an external cluster) sends its batches through that KV, not
// straight through the connection, which would pass the wrapper by.
func TestWriterThroughAWrappedKVOverGRPC(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	kv := &countingKV{KV: cli.KV}
	cli.KV = kv
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	w := stream.NewWriter(cli, keys, stream.Limits{}, time.Millisecond)
	const id = "wrapped-1"
	c1 := claimKey(t, cli, keys, id)
	before := kv.txns.Load()
	if _, _, err := w.Append(context.Background(), stream.Claim{Task: id, Attempt: 1, Worker: "w1", Fence: c1}, []stream.Input{{Type: "log", Data: text(1)}}); err != nil {
		t.Fatal(err)
	}
	// The read of the stream's head and the batch.
	if n := kv.txns.Load() - before; n < 2 {
		t.Fatalf("%d transactions through the wrapped KV, want the read and the batch", n)
	}
	checkSeq(t, collect(t, stream.NewHub(cli, keys), id, 1, 2), 1)
}
