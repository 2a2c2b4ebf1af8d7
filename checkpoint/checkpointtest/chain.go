package checkpointtest

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/lock"
)

// chain: a chain of five checkpoints reads back by Get, GetLatest and
// List (before, limit, filter); pending writes attach to a checkpoint that
// exists only; DeleteThread removes the thread.
func chain(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	parent := ""
	var ids []string
	for i := 0; i < 5; i++ {
		src := "loop"
		if i == 0 {
			src = "input"
		}
		cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: parent, State: []byte(strconv.Itoa(i)),
			Metadata: checkpoint.Metadata{Source: src, Step: i, Writer: "w"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		parent = cp.ID
		ids = append(ids, cp.ID)
		time.Sleep(time.Millisecond)
	}
	latest, err := s.GetLatest(ctx, "th", "")
	if err != nil || latest.ID != ids[4] || string(latest.State) != "4" || latest.ParentID != ids[3] {
		t.Fatalf("latest %+v (%v)", latest, err)
	}
	if got, err := s.Get(ctx, "th", "", ids[1]); err != nil || string(got.State) != "1" {
		t.Fatalf("get %+v (%v)", got, err)
	}
	list, err := s.List(ctx, "th", "", checkpoint.ListOptions{Before: ids[4], Limit: 2})
	if err != nil || len(list) != 2 || list[0].ID != ids[3] || list[1].ID != ids[2] {
		t.Fatalf("list before/limit: %+v (%v)", list, err)
	}
	list, err = s.List(ctx, "th", "", checkpoint.ListOptions{Filter: map[string]any{"source": "input"}})
	if err != nil || len(list) != 1 || list[0].ID != ids[0] {
		t.Fatalf("list filtered: %+v (%v)", list, err)
	}
	if err := s.PutWrites(ctx, "th", "", ids[4], []checkpoint.Write{{TaskID: "t1", Channel: "messages", Value: []byte("hi")}}, nil); err != nil {
		t.Fatal(err)
	}
	if ws, err := s.Writes(ctx, "th", "", ids[4]); err != nil || len(ws) != 1 || string(ws[0].Value) != "hi" {
		t.Fatalf("writes %+v (%v)", ws, err)
	}
	if err := s.PutWrites(ctx, "th", "", "nope", nil, nil); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("writes for a missing checkpoint: %v", err)
	}
	if err := s.DeleteThread(ctx, "th"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLatest(ctx, "th", ""); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

// conflict: a second writer on the same parent loses (a
// *ConflictError naming the new head) and writes nothing.
func conflict(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	root, _ := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("0")}, nil)
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: root.ID, State: []byte("a")}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: root.ID, State: []byte("b")}, nil)
	var ce *checkpoint.ConflictError
	if !errors.As(err, &ce) || ce.Head == root.ID || ce.Head == "" {
		t.Fatalf("second writer on the same parent: %v", err)
	}
	if latest, _ := s.GetLatest(ctx, "th", ""); string(latest.State) != "a" {
		t.Fatalf("the losing write got through: %q", latest.State)
	}
}

// tokenFence: a write under an older fencing token is refused with
// lock.ErrFenced, and the newer holder goes on.
func tokenFence(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("by 5")}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	// A writer whose lock expired (an older token) is refused...
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: cp.ID, State: []byte("by 3")}, token(3)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("older token: %v, want ErrFenced", err)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, []checkpoint.Write{{TaskID: "t", Channel: "c"}}, token(4)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("older token on writes: %v", err)
	}
	// ...and the newer holder goes on.
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: cp.ID, State: []byte("by 7")}, token(7)); err != nil {
		t.Fatal(err)
	}
	if latest, _ := s.GetLatest(ctx, "th", ""); string(latest.State) != "by 7" || latest.Token != 7 {
		t.Fatalf("latest %+v", latest)
	}
}

// largeFencedState: a fenced Put and a fenced Append of the largest state
// the store takes (Options.MaxState, else checkpoint.MaxState) are stored
// and read back whole; a superseded token's large Put and Append are
// refused and store nothing.
func largeFencedState(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	n := opts.MaxState
	if n == 0 {
		n = checkpoint.MaxState
	}
	state := func(c byte) []byte { return bytes.Repeat([]byte{c}, n) }
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "big", State: state('p')}, token(5))
	if err != nil {
		t.Fatalf("a fenced put of %d bytes of state: %v", n, err)
	}
	ap, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "big", ParentID: cp.ID, State: state('a')}, token(7))
	if err != nil {
		t.Fatalf("a fenced append of %d bytes of state: %v", n, err)
	}
	if got, err := s.Get(ctx, "big", "", cp.ID); err != nil || !bytes.Equal(got.State, state('p')) || got.Token != 5 {
		t.Fatalf("the put read back: %v, or not its state and token", err)
	}
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "big", ParentID: ap.ID, State: state('x')}, token(6)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("a superseded token's put: %v, want ErrFenced", err)
	}
	if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "big", ParentID: ap.ID, State: state('x')}, token(6)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("a superseded token's append: %v, want ErrFenced", err)
	}
	latest, err := s.GetLatest(ctx, "big", "")
	if err != nil || latest.ID != ap.ID || !bytes.Equal(latest.State, state('a')) || latest.Token != 7 {
		t.Fatalf("the head after the refused writes: %v, or not the append", err)
	}
	if all, err := s.List(ctx, "big", "", checkpoint.ListOptions{}); err != nil || len(all) != 2 {
		t.Fatalf("the thread's checkpoints: %d, %v: want the two not refused", len(all), err)
	}
}

// badInput: a bad thread id, and a state over Options.MaxState, are
// refused as input errors and write nothing.
func badInput(ctx context.Context, t *testing.T, s checkpoint.Store, opts Options) {
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "a/b"}, nil); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("bad thread id: %v", err)
	}
	if opts.MaxState > 0 {
		if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: make([]byte, opts.MaxState+1)}, nil); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("oversize state: %v", err)
		}
	}
	if _, err := s.GetLatest(ctx, "th", ""); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("nothing should have been written: %v", err)
	}
}
