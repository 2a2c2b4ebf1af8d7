package queue

import (
	"context"
	"slices"
	"testing"
)

// slotsOf returns the slots claims took.
func slotsOf(claims []*claim) []int {
	out := make([]int, len(claims))
	for i, c := range claims {
		out[i] = c.slot
	}
	return out
}

// A claim loop's next claim on the segment it took from last skips the
// read: the state its last claim left is what the segment reads as, its
// own outcomes in between do not spoil it, and it never takes a slot twice.
func TestPredictedClaimMatchesTheRead(t *testing.T) {
	e := newReviewEnv(t).space(t)
	seg := e.submitSegment(t, "p", 40)
	w := e.worker(t, WorkerConfig{Concurrency: 40, Prefetch: 10})
	ctx := context.Background()

	first := claimRun(t, w, seg, 10)
	batch := make([]outcome, len(first))
	for i, cl := range first {
		batch[i] = outcome{c: cl, kind: Succeeded, result: []byte("ok")}
	}
	w.commit(batch) // the worker's own outcomes: the next claim still skips the read
	taken := slotsOf(first)
	for round := 0; round < 3; round++ {
		w.levelMu.Lock()
		predicted := w.predicted[0]
		w.levelMu.Unlock()
		if predicted == nil {
			t.Fatalf("round %d: no predicted state after a claim that left slots", round)
		}
		read, err := e.c.readState(ctx, reviewQueue, seg)
		if err != nil {
			t.Fatal(err)
		}
		// Slots that finished since are not free either way; the rest agree.
		if want, got := read.free(), predicted.free(); !slices.Equal(want, got) {
			t.Fatalf("round %d: predicted free slots %v, read %v", round, got, want)
		}
		claims, ok, err := w.claimPredicted(ctx, 0, 10)
		if err != nil || !ok || len(claims) != 10 {
			t.Fatalf("round %d: predicted claim took %d (ok %v, %v), want 10", round, len(claims), ok, err)
		}
		for _, cl := range claims {
			if slices.Contains(taken, cl.slot) {
				t.Fatalf("round %d: slot %d claimed twice", round, cl.slot)
			}
			if cl.task.Attempt != 1 {
				t.Fatalf("slot %d: attempt %d, want 1", cl.slot, cl.task.Attempt)
			}
			taken = append(taken, cl.slot)
		}
	}
	if len(taken) != 40 {
		t.Fatalf("took %d slots, want 40", len(taken))
	}
}

// When another worker claimed from the segment since, the predicted claim
// is refused by its compares, the loop forgets the prediction, and the
// claim that reads first takes only the slots nobody holds.
func TestPredictedClaimRefusedAfterAnotherClaim(t *testing.T) {
	e := newReviewEnv(t).space(t)
	seg := e.submitSegment(t, "q", 30)
	a := e.worker(t, WorkerConfig{Concurrency: 30, Prefetch: 10})
	b := e.worker(t, WorkerConfig{Concurrency: 30, Prefetch: 10})
	ctx := context.Background()

	fromA := claimRun(t, a, seg, 10)
	fromB := claimRun(t, b, seg, 10)
	claims, ok, err := a.claimPredicted(ctx, 0, 10)
	if err != nil || ok || len(claims) != 0 {
		t.Fatalf("a predicted claim after another worker's claim took %d (ok %v, %v); want it refused", len(claims), ok, err)
	}
	a.levelMu.Lock()
	left := a.predicted[0]
	a.levelMu.Unlock()
	if left != nil {
		t.Fatal("the refused prediction was kept")
	}
	rest := claimRun(t, a, seg, 10)
	seen := map[int]bool{}
	for _, cl := range append(append(fromA, fromB...), rest...) {
		if seen[cl.slot] {
			t.Fatalf("slot %d claimed twice", cl.slot)
		}
		seen[cl.slot] = true
	}
}
