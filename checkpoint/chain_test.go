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

// chainOf is a chain of n checkpoints of thread th after parent, ids
// prefix0..n-1, each with one write of its parent by task t.
func chainOf(th, parent, prefix string, n, stateBytes int) []checkpoint.Link {
	links := make([]checkpoint.Link, n)
	for i := range links {
		id := fmt.Sprintf("%s%d", prefix, i)
		links[i].Checkpoint = checkpoint.Checkpoint{ThreadID: th, ID: id, ParentID: parent, State: []byte(strings.Repeat("s", stateBytes))}
		if parent != "" {
			links[i].ParentWrites = []checkpoint.Write{{TaskID: "t", Channel: "a", Value: []byte(parent)}}
		}
		parent = id
	}
	return links
}

// TestPutChainOneTransaction: a chain that fits is stored at one revision,
// every checkpoint with its parent, the parents' writes and the last
// one's; the head is the last.
func TestPutChainOneTransaction(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c0"}, token(3)); err != nil {
		t.Fatal(err)
	}
	last := []checkpoint.Write{{TaskID: "u", Channel: "b", Value: []byte("end")}}
	cps, err := s.PutChain(ctx, chainOf("th", "c0", "k", 4, 100), last, token(3), true)
	if err != nil || len(cps) != 4 || cps[3].Token != 3 {
		t.Fatalf("put chain: %+v, %v", cps, err)
	}
	rev, _ := modRevs(t, ns, "th", "k0")
	for _, id := range []string{"c0", "k0", "k1", "k2", "k3"} {
		cp, w := modRevs(t, ns, "th", id)
		if (id != "c0" && cp != rev) || w != rev {
			t.Fatalf("%s at revisions %d (writes %d), the chain's first at %d: not one transaction", id, cp, w, rev)
		}
	}
	head, err := s.GetLatest(ctx, "th", "")
	if err != nil || head.ID != "k3" || head.ParentID != "k2" {
		t.Fatalf("head %+v, %v: want k3 after k2", head, err)
	}
	for id, want := range map[string]string{"c0": "c0", "k1": "k1", "k3": "end"} {
		ws, err := s.Writes(ctx, "th", "", id)
		if err != nil || len(ws) != 1 || string(ws[0].Value) != want {
			t.Fatalf("writes of %s: %+v, %v; want one of %q", id, ws, err, want)
		}
	}
}

// TestPutChainRefusedStoresNothing: a chain refused by compare-and-swap,
// a lower token or a missing parent stores none of its checkpoints and
// none of its writes; appended again (a lost answer) it stores the same.
func TestPutChainRefusedStoresNothing(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	for _, id := range []string{"c0", "c1"} {
		parent := map[string]string{"c1": "c0"}[id]
		if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: id, ParentID: parent}, token(5)); err != nil {
			t.Fatal(err)
		}
	}
	for name, c := range map[string]struct {
		parent string
		fence  checkpoint.Fence
		cas    bool
		want   error
	}{
		"compare-and-swap": {"c0", token(5), true, checkpoint.ErrConflict},
		"a lower token":    {"c1", token(4), false, lock.ErrFenced},
		"a missing parent": {"gone", token(5), false, checkpoint.ErrNotFound},
	} {
		_, err := s.PutChain(ctx, chainOf("th", c.parent, "r", 3, 10), nil, c.fence, c.cas)
		if !errors.Is(err, c.want) {
			t.Fatalf("%s: %v, want %v", name, err, c.want)
		}
		for _, id := range []string{"r0", "r1", "r2"} {
			if cp, w := modRevs(t, ns, "th", id); cp != 0 || w != 0 {
				t.Fatalf("%s: %s was stored", name, id)
			}
		}
		if _, w := modRevs(t, ns, "th", c.parent); w != 0 {
			t.Fatalf("%s: the parent's writes were stored", name)
		}
	}
	for range 2 {
		if _, err := s.PutChain(ctx, chainOf("th", "c1", "r", 3, 10), []checkpoint.Write{{TaskID: "u", Channel: "b"}}, token(5), false); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"c1", "r0", "r1", "r2"} {
		if ws, err := s.Writes(ctx, "th", "", id); err != nil || len(ws) != 1 {
			t.Fatalf("writes of %s after the chain twice: %+v, %v", id, ws, err)
		}
	}
}

// TestPutChainMergesStoredWrites: writes stored for the first parent
// before the chain are kept, the chain's merged in.
func TestPutChainMergesStoredWrites(t *testing.T) {
	t.Parallel()
	s, _ := newStore(t)
	ctx := context.Background()
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "c0"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := s.PutWrites(ctx, "th", "", "c0", []checkpoint.Write{{TaskID: "other", Channel: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutChain(ctx, chainOf("th", "c0", "k", 2, 10), nil, nil, true); err != nil {
		t.Fatal(err)
	}
	ws, err := s.Writes(ctx, "th", "", "c0")
	if err != nil || len(ws) != 2 {
		t.Fatalf("writes of c0: %+v, %v; want the stored one and the chain's", ws, err)
	}
}

// TestPutChainTooLargeGoesLinkByLink: a chain past one transaction's
// bytes is stored link by link, whole; one refused part way says how many
// were stored.
func TestPutChainTooLargeGoesLinkByLink(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	cps, err := s.PutChain(ctx, chainOf("th", "", "b", 3, 700<<10), nil, token(2), false)
	if err != nil || len(cps) != 3 {
		t.Fatalf("large chain: %v", err)
	}
	r0, _ := modRevs(t, ns, "th", "b0")
	if r2, _ := modRevs(t, ns, "th", "b2"); r2 == r0 {
		t.Fatal("a chain past one transaction's bytes was stored in one")
	}
	// The second link refused: its parent is not the head any more once
	// another checkpoint follows the first.
	links := chainOf("th", "b2", "p", 3, 700<<10)
	links[1].Checkpoint.ParentID = "b2"
	if _, err := s.PutChain(ctx, links, nil, token(2), true); err == nil {
		t.Fatal("a chain whose links do not follow one another was taken")
	} else {
		var ie *drover.InputError
		if !errors.As(err, &ie) || ie.Field != "checkpoints[1].parent_checkpoint_id" {
			t.Fatalf("err %v: want an input error naming checkpoints[1].parent_checkpoint_id", err)
		}
	}
	if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ID: "side", ParentID: "b2"}, token(2)); err != nil {
		t.Fatal(err)
	}
	_, err = s.PutChain(ctx, chainOf("th", "side", "q", 3, 700<<10), nil, token(1), false)
	if !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("a fenced large chain: %v", err)
	}
	var ce *checkpoint.ChainError
	if errors.As(err, &ce) {
		t.Fatalf("a chain refused at its first link reported %d stored", ce.Stored)
	}
	// Refused at its second link (its parent's writes past MaxState): the
	// first stays stored, and the error says so.
	links = chainOf("th", "side", "w", 3, 700<<10)
	links[1].ParentWrites[0].Value = []byte(strings.Repeat("v", checkpoint.MaxState))
	_, err = s.PutChain(ctx, links, nil, token(2), false)
	if !errors.As(err, &ce) || ce.Stored != 1 {
		t.Fatalf("a chain refused at its second link: %v; want a ChainError of 1 stored", err)
	}
	if head, err := s.GetLatest(ctx, "th", ""); err != nil || head.ID != "w0" {
		t.Fatalf("head %+v, %v; want w0, the part stored", head, err)
	}
}

// TestPutChainChecksItsInput: bad chains are refused naming the field,
// storing nothing.
func TestPutChainChecksItsInput(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	noID := chainOf("th", "", "n", 2, 1)
	noID[1].Checkpoint.ID = ""
	twice := chainOf("th", "", "d", 2, 1)
	twice[1].Checkpoint.ID, twice[1].Checkpoint.ParentID = "d0", "d0"
	other := chainOf("th", "", "o", 2, 1)
	other[1].Checkpoint.ThreadID = "th2"
	cycle := chainOf("th", "c2", "c", 3, 1) // c0 on c2, c1 on c0, c2 on c1
	for field, links := range map[string][]checkpoint.Link{
		"checkpoints":                         nil,
		"checkpoints[1].checkpoint_id":        noID,
		"checkpoints[1]":                      other,
		"checkpoints[0].parent_checkpoint_id": cycle,
	} {
		_, err := s.PutChain(ctx, links, nil, nil, false)
		var ie *drover.InputError
		if !errors.As(err, &ie) || ie.Field != field {
			t.Fatalf("%s: err %v", field, err)
		}
	}
	if _, err := s.PutChain(ctx, twice, nil, nil, false); err == nil {
		t.Fatal("a chain naming one id twice was taken")
	}
	for _, id := range []string{"n0", "d0", "o0", "c0", "c2"} {
		if cp, _ := modRevs(t, ns, "th", id); cp != 0 {
			t.Fatalf("a refused chain stored %s", id)
		}
	}
}
