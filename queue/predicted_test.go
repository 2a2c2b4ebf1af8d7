package queue

import (
	"context"
	"fmt"
	"slices"
	"strings"
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
		w.sched.levelMu.Lock()
		predicted := w.sched.predicted[0]
		w.sched.levelMu.Unlock()
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
		claims, ok, err := w.sched.claimPredicted(ctx, 0, 10)
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
	claims, ok, err := a.sched.claimPredicted(ctx, 0, 10)
	if err != nil || ok || len(claims) != 0 {
		t.Fatalf("a predicted claim after another worker's claim took %d (ok %v, %v); want it refused", len(claims), ok, err)
	}
	a.sched.levelMu.Lock()
	left := a.sched.predicted[0]
	a.sched.levelMu.Unlock()
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

// A run another worker made after the prediction and that ended with its
// lease leaves only its try; the predicted claim is refused (it would count
// that attempt's slots as never tried), and the claim that reads first
// takes them with the attempt after it.
func TestPredictedClaimRefusedAfterADeadRun(t *testing.T) {
	e := newReviewEnv(t).space(t)
	seg := e.submitSegment(t, "d", 30)
	a := e.worker(t, WorkerConfig{Concurrency: 30, Prefetch: 10})
	b := e.worker(t, WorkerConfig{Concurrency: 30, Prefetch: 10})
	ctx := context.Background()

	claimRun(t, a, seg, 10)
	fromB := claimRun(t, b, seg, 10)
	if err := b.lease.Close(ctx); err != nil { // b dies: its run goes, its try stays
		t.Fatal(err)
	}
	claims, ok, err := a.sched.claimPredicted(ctx, 0, 10)
	if err != nil || ok || len(claims) != 0 {
		t.Fatalf("a predicted claim after a dead run took %d (ok %v, %v); want it refused", len(claims), ok, err)
	}
	again := claimRun(t, a, seg, 10)
	died := map[int]bool{}
	for _, cl := range fromB {
		died[cl.slot] = true
	}
	for _, cl := range again {
		if died[cl.slot] && cl.task.Attempt != 2 {
			t.Fatalf("slot %d, whose first attempt died, claimed as attempt %d; want 2", cl.slot, cl.task.Attempt)
		}
	}
}

// A loop that used up its segment guesses the next one of its last list;
// its next claim lists the open segments again and takes a higher-priority
// segment submitted since, not the guess.
func TestGuessedSegmentYieldsToHigherPriority(t *testing.T) {
	e := newReviewEnv(t).space(t)
	ctx := context.Background()
	submit := func(prefix string, prio int) {
		ts := make([]Task, 10)
		for i := range ts {
			ts[i] = Task{ID: fmt.Sprintf("%s-%d", prefix, i), Type: "work", Metadata: Metadata{Priority: prio}}
		}
		if _, err := e.c.Submit(ctx, reviewQueue, ts, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 6; i++ {
		submit(fmt.Sprintf("low-%d", i), 1)
	}
	w := e.worker(t, WorkerConfig{Concurrency: 60, Prefetch: 10})
	// Claims pick among the first segments at random: claim whole segments
	// until one leaves a guess (one whose list has a segment after it).
	for i := 0; ; i++ {
		took, _, _, err := w.sched.claim(ctx, 0, 10)
		if err != nil || len(took) != 10 {
			t.Fatalf("claim %d took %d, %v", i, len(took), err)
		}
		if seg, guessed := w.sched.hotSegment(0); guessed && seg != "" {
			break
		}
		if i == 4 {
			t.Fatal("no claim that took a segment's last slots left a guess at the next")
		}
	}
	submit("high", 9)
	next, _, _, err := w.sched.claim(ctx, 0, 10)
	if err != nil || len(next) == 0 {
		t.Fatalf("second claim took %d, %v", len(next), err)
	}
	for _, cl := range next {
		if !strings.HasPrefix(cl.task.ID, "high-") {
			t.Fatalf("claimed %s before the higher-priority tasks", cl.task.ID)
		}
	}
}
