package checkpoint_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
)

// modRevs are the revisions at which the checkpoint id of thread th and
// its pending writes were last written (0: absent).
func modRevs(t *testing.T, ns, th, id string) (cp, writes int64) {
	t.Helper()
	keys, nsName := keyspace.MustNew(ns), keyspace.CheckpointNSName("")
	cli := srv.Client(t)
	for key, rev := range map[string]*int64{keys.CheckpointKey(th, nsName, id): &cp, keys.CheckpointWrites(th, nsName, id): &writes} {
		g, err := cli.Get(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Kvs) > 0 {
			*rev = g.Kvs[0].ModRevision
		}
	}
	return cp, writes
}

// TestPutWithWritesOneTransaction: PutWithWrites stores the parent's writes
// and the checkpoint at one revision; refused (by compare-and-swap, the
// thread's token fence, a missing parent) it stores neither, and the
// parent's writes are as before.
func TestPutWithWritesOneTransaction(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	c1, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c1"}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	w := func(task string) []checkpoint.Write {
		return []checkpoint.Write{{TaskID: task, Channel: "a", Value: []byte("1")}, {TaskID: task, Channel: "__error__", Idx: -1}}
	}
	c2, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c2", ParentID: c1.ID}, w("t1"), token(5))
	if err != nil || c2.Token != 5 {
		t.Fatalf("put with writes: %+v, %v", c2, err)
	}
	if _, wrev := modRevs(t, ns, "th", c1.ID); wrev == 0 {
		t.Fatal("the parent's writes were not stored")
	} else if cprev, _ := modRevs(t, ns, "th", c2.ID); cprev != wrev {
		t.Fatalf("the writes at revision %d, the checkpoint at %d: not one transaction", wrev, cprev)
	}
	_, before := modRevs(t, ns, "th", c1.ID)
	for name, c := range map[string]struct {
		cp    checkpoint.Checkpoint
		fence checkpoint.Fence
		want  error
	}{
		"compare-and-swap": {checkpoint.Checkpoint{ThreadID: "th", ID: "c3", ParentID: c1.ID}, token(5), checkpoint.ErrConflict},
		"a lower token":    {checkpoint.Checkpoint{ThreadID: "th", ID: "c3", ParentID: c1.ID}, token(4), lock.ErrFenced},
		"append, fenced":   {checkpoint.Checkpoint{ThreadID: "th", ID: "c3", ParentID: c1.ID}, token(4), lock.ErrFenced},
	} {
		put := s.PutWithWrites
		if strings.HasPrefix(name, "append") {
			put = s.AppendWithWrites
		}
		_, err := put(ctx, c.cp, w("t2"), c.fence)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", name, err, c.want)
		}
		if _, after := modRevs(t, ns, "th", c1.ID); after != before {
			t.Fatalf("%s: the refused put changed the parent's writes", name)
		}
		if cp, _ := modRevs(t, ns, "th", "c3"); cp != 0 {
			t.Fatalf("%s: the refused checkpoint was stored", name)
		}
	}
	var ce *checkpoint.ConflictError
	if _, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: c1.ID}, w("t2"), nil); !errors.As(err, &ce) || ce.Head != c2.ID {
		t.Fatalf("the conflict names the head: %v", err)
	}
	if _, err := s.AppendWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c3", ParentID: "c0"}, w("t2"), token(5)); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("writes of a missing parent: %v", err)
	}
	if cp, writes := modRevs(t, ns, "th", "c3"); cp != 0 || writes != 0 {
		t.Fatal("a put on a missing parent stored something")
	}
	// Append on a parent that is not the head stores both.
	if _, err := s.AppendWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c3", ParentID: c1.ID}, w("t2"), token(5)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.Writes(ctx, "th", "", c1.ID); len(got) != 4 || got[2].TaskID != "t2" {
		t.Fatalf("the parent's writes after the append: %+v", got)
	}
}

// TestPutWithWritesTooLargeForOneRequest: state and writes each within the
// store's bound but together past one etcd request go in two
// transactions, the writes first; a checkpoint refused then keeps them.
func TestPutWithWritesTooLargeForOneRequest(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	c1, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "big", ID: "c1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	state := []byte(strings.Repeat("s", 700<<10))
	big := []checkpoint.Write{{TaskID: "t1", Channel: "c", Value: []byte(strings.Repeat("v", 500<<10))}}
	c2, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "big", ID: "c2", ParentID: c1.ID, State: state}, big, nil)
	if err != nil {
		t.Fatal(err)
	}
	cprev, _ := modRevs(t, ns, "big", c2.ID)
	if _, wrev := modRevs(t, ns, "big", c1.ID); wrev == 0 || wrev >= cprev {
		t.Fatalf("the writes at revision %d, the checkpoint at %d: want the writes first", wrev, cprev)
	}
	// A put whose state and own writes are past one request (1 MiB and 150 KiB) goes in two
	// transactions too: refused, it keeps its writes, merged with those stored.
	state = []byte(strings.Repeat("s", checkpoint.MaxState))
	more := []checkpoint.Write{{TaskID: "t2", Channel: "c", Value: []byte(strings.Repeat("w", 150<<10))}}
	if _, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "big", ID: "c3", ParentID: c1.ID, State: state}, more, nil); !errors.Is(err, checkpoint.ErrConflict) {
		t.Fatalf("a put on a parent not the head: %v", err)
	}
	if got, _ := s.Writes(ctx, "big", "", c1.ID); len(got) != 2 {
		t.Fatalf("the writes of the refused checkpoint: %d, want them kept", len(got))
	}
}

// TestFencedPutWithWritesOneRequest: a fenced transaction carries its
// values once, as an unfenced one does, so a fenced put of state and
// writes that fit one request together goes in one transaction, and one
// too large for it in two, the writes first.
func TestFencedPutWithWritesOneRequest(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	c1, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "fbig", ID: "c1"}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	state := []byte(strings.Repeat("s", 400<<10))
	big := []checkpoint.Write{{TaskID: "t1", Channel: "c", Value: []byte(strings.Repeat("v", 400<<10))}}
	c2, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "fbig", ID: "c2", ParentID: c1.ID, State: state}, big, token(5))
	if err != nil {
		t.Fatalf("a fenced put of 400 KiB state and 400 KiB writes: %v", err)
	}
	if _, wrev := modRevs(t, ns, "fbig", c1.ID); wrev == 0 {
		t.Fatal("the parent's writes were not stored")
	} else if cprev, _ := modRevs(t, ns, "fbig", c2.ID); cprev != wrev {
		t.Fatalf("the writes at revision %d, the checkpoint at %d: want one transaction", wrev, cprev)
	}
	state = []byte(strings.Repeat("s", 700<<10))
	big[0].Value = []byte(strings.Repeat("v", 500<<10))
	c3, err := s.PutWithWrites(ctx, checkpoint.Checkpoint{ThreadID: "fbig", ID: "c3", ParentID: c2.ID, State: state}, big, token(5))
	if err != nil {
		t.Fatalf("a fenced put of 700 KiB state and 500 KiB writes: %v", err)
	}
	cprev, _ := modRevs(t, ns, "fbig", c3.ID)
	if _, wrev := modRevs(t, ns, "fbig", c2.ID); wrev == 0 || wrev >= cprev {
		t.Fatalf("the writes at revision %d, the checkpoint at %d: want the writes first", wrev, cprev)
	}
}
