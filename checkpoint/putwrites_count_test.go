package checkpoint_test

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// countedKV counts the reads and transactions sent through the KV it wraps.
type countedKV struct {
	clientv3.KV
	gets, txns atomic.Int64
}

func (k *countedKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.gets.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k *countedKV) Txn(ctx context.Context) clientv3.Txn {
	k.txns.Add(1)
	return k.KV.Txn(ctx)
}

// take answers the requests counted since the last take.
func (k *countedKV) take() (gets, txns int64) { return k.gets.Swap(0), k.txns.Swap(0) }

// TestPutWithWritesAsksOnceWhenNoneStored: a put whose parent has no
// pending writes stored is one etcd request (no read of them first); one
// whose parent has some is two (the refusal reads them), and the stored
// writes and the new ones are both kept; a moved head is still a conflict
// after one request, storing nothing.
func TestPutWithWritesAsksOnceWhenNoneStored(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	kv := &countedKV{KV: cli.KV}
	cli.KV = kv
	s, err := checkpoint.NewEtcd(cli, etcdtest.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	c1, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "n", ID: "c1"}, token(3))
	if err != nil {
		t.Fatal(err)
	}
	kv.take()
	w := func(task string) []checkpoint.Write {
		return []checkpoint.Write{{TaskID: task, Channel: "a", Value: []byte(task)}}
	}
	if _, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "n", ID: "c2", ParentID: c1.ID}, w("t1"), token(3)); err != nil {
		t.Fatal(err)
	}
	if gets, txns := kv.take(); gets != 0 || txns != 1 {
		t.Fatalf("a put with writes, none stored before: %d reads and %d transactions, want 0 and 1", gets, txns)
	}

	// Writes stored for c2 first (another task's), then a put that brings more.
	if err := s.PutWrites(ctx, "n", "", "c2", w("t2"), token(3)); err != nil {
		t.Fatal(err)
	}
	kv.take()
	c3, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "n", ID: "c3", ParentID: "c2"}, w("t3"), token(3))
	if err != nil {
		t.Fatal(err)
	}
	if gets, txns := kv.take(); gets != 0 || txns != 2 {
		t.Fatalf("a put with writes, some stored before: %d reads and %d transactions, want 0 and 2", gets, txns)
	}
	got, err := s.Writes(ctx, "n", "", "c2")
	if err != nil {
		t.Fatal(err)
	}
	tasks := []string{}
	for _, x := range got {
		tasks = append(tasks, x.TaskID+"="+string(x.Value))
	}
	if !slices.Equal(tasks, []string{"t2=t2", "t3=t3"}) {
		t.Fatalf("c2's writes are %v, want the stored and the new: [t2=t2 t3=t3]", tasks)
	}

	// The head is c3: a put on c2 is refused after one request, its writes not stored.
	kv.take()
	_, err = s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "n", ID: "c4", ParentID: "c2"}, w("t4"), token(3))
	var ce *checkpoint.ConflictError
	if !errors.As(err, &ce) || ce.Head != c3.ID {
		t.Fatalf("a put on a parent that is no longer the head: %v, want a conflict naming head %s", err, c3.ID)
	}
	if gets, txns := kv.take(); gets != 0 || txns != 1 {
		t.Fatalf("a refused put: %d reads and %d transactions, want 0 and 1", gets, txns)
	}
	if got, err := s.Writes(ctx, "n", "", "c2"); err != nil || len(got) != 2 {
		t.Fatalf("after the refused put c2 has %d writes (%v), want 2", len(got), err)
	}
}

// TestPutWithWritesGuessedLargeCases: where the writes stored for the
// parent decide, they are read first or the put is all or nothing. A
// write replayed at an index keeps its stored value, so new writes past
// MaxState alone are no error when the stored one is small; a put that
// fits one request by its own writes but is refused (the head moved)
// stores nothing, whatever is stored already.
func TestPutWithWritesGuessedLargeCases(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	c1, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "g", ID: "c1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.PutWrites(ctx, "g", "", c1.ID, []checkpoint.Write{{TaskID: "t", Channel: "a", Value: []byte("small")}}, nil); err != nil {
		t.Fatal(err)
	}
	replay := []checkpoint.Write{{TaskID: "t", Channel: "a", Value: bytes.Repeat([]byte("x"), checkpoint.MaxState+1)}}
	c2, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "g", ID: "c2", ParentID: c1.ID}, replay, nil)
	if err != nil {
		t.Fatalf("a replayed write past MaxState whose stored value is small: %v, want the put stored", err)
	}
	if got, err := s.Writes(ctx, "g", "", c1.ID); err != nil || len(got) != 1 || string(got[0].Value) != "small" {
		t.Fatalf("c1's writes after the replay: %d (%v), want the stored one kept", len(got), err)
	}

	// c2's writes are large; a put on c1 (no longer the head) with a large state and a small write.
	if err := s.PutWrites(ctx, "g", "", c2.ID, []checkpoint.Write{{TaskID: "u", Channel: "a", Value: bytes.Repeat([]byte("w"), 500<<10)}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "g", ID: "c3", ParentID: c2.ID}, nil); err != nil {
		t.Fatal(err)
	}
	state := bytes.Repeat([]byte("s"), 700<<10)
	_, err = s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "g", ID: "c4", ParentID: c2.ID, State: state}, []checkpoint.Write{{TaskID: "v", Channel: "a"}}, nil)
	if !errors.Is(err, checkpoint.ErrConflict) {
		t.Fatalf("a put on a parent not the head: %v, want a conflict", err)
	}
	if got, err := s.Writes(ctx, "g", "", c2.ID); err != nil || len(got) != 1 {
		t.Fatalf("c2's writes after the refused put: %d (%v), want only the one stored before", len(got), err)
	}
}
