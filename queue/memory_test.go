package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The state a claim keeps for the next claim of its session (after) holds
// which slots succeeded, not their results: kept per session, a segment's
// results would stay in memory for as long as the session claims.
func TestKeptStateHoldsNoResults(t *testing.T) {
	big := []byte(strings.Repeat("r", 1<<16))
	out := &outValue{}
	st := &segState{name: "s1", n: 10, ok: map[int]okRef{
		1: {okSlot: okSlot{Slot: 1, Attempt: 2, Result: big}, out: out},
		4: {okSlot: okSlot{Slot: 4, Attempt: 1, Result: big}, out: out},
	}}
	r := &segRun{seg: "s1", runKey: "runs/s1/a", tryKey: "tries/s1/a", token: 7, v: runValue{Slots: []int{2, 3}, Attempts: []int{1, 1}}}
	next := st.after(r, "runs/s1/", []int{2, 3})
	if len(next.ok) != 2 {
		t.Fatalf("kept %d succeeded slots, want 2", len(next.ok))
	}
	for slot, ref := range next.ok {
		if ref.Result != nil || ref.out != nil || ref.Slot != slot || ref.Attempt != st.ok[slot].Attempt {
			t.Fatalf("slot %d kept as %+v", slot, ref)
		}
	}
	if st.ok[1].Result == nil || st.ok[1].out == nil {
		t.Fatal("the read's own state lost its results")
	}
	if again := next.after(&segRun{seg: "s1", runKey: "runs/s1/b", tryKey: "tries/s1/b", token: 9, v: runValue{Slots: []int{5}, Attempts: []int{1}}}, "runs/s1/", []int{5}); fmt.Sprintf("%p", again.ok) != fmt.Sprintf("%p", next.ok) {
		t.Fatal("a kept state without results was copied again")
	}
}

// The claim memory is bounded by the bytes of the tasks it holds, not only
// by their number: past claimCacheBytes it starts over.
func TestClaimMemoryBoundedByBytes(t *testing.T) {
	var cc claimCache
	input := strings.Repeat("i", 64<<10)
	prefix := func(seg string) string { return "runs/" + seg + "/" }
	for i := 0; i < 2000; i++ {
		task := &Task{ID: fmt.Sprintf("t%d", i), InputDataURI: input}
		seg := fmt.Sprintf("s%d", i)
		run := &segRun{seg: seg, runKey: prefix(seg) + "r", token: int64(i + 1), v: runValue{Slots: []int{0}, Attempts: []int{1}}}
		cc.remember(prefix, "q", []*claim{{task: task, run: run, slot: 0}}, []*Task{task}, 1)
		if cc.bytes > claimCacheBytes+taskBytes(task) {
			t.Fatalf("after %d runs the memory holds %d bytes, over %d", i+1, cc.bytes, claimCacheBytes)
		}
	}
	if len(cc.runs) == 0 || len(cc.runs) > claimCacheBytes/len(input)+1 {
		t.Fatalf("%d runs remembered", len(cc.runs))
	}
	sum := 0
	for _, r := range cc.runs {
		sum += r.size
	}
	if sum != cc.bytes {
		t.Fatalf("bytes %d, runs hold %d", cc.bytes, sum)
	}
	for _, r := range cc.runs {
		cc.forget(r)
	}
	if cc.bytes != 0 || len(cc.slots) != 0 {
		t.Fatalf("after forgetting every run: %d bytes, %d slots", cc.bytes, len(cc.slots))
	}
}

// A claim waiting for a combined claim leaves the line when its context
// ends, unless it was taken into a claim being made or made the next
// maker: it then waits for that claim's answer (a run made for it must not
// be left behind).
func TestClaimWaitLeavesLineOnCancel(t *testing.T) {
	var cc claimCombiner
	line := &claimLine{busy: true}
	waiting := &claimCall{done: make(chan struct{})}
	taken := &claimCall{done: make(chan struct{})}
	line.waiting = []*claimCall{waiting}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := cc.await(ctx, line, waiting); !errors.Is(err, context.Canceled) {
		t.Fatalf("a waiting claim whose context ended: %v", err)
	}
	if len(line.waiting) != 0 {
		t.Fatalf("it is still in the line: %d waiting", len(line.waiting))
	}

	answered := make(chan error, 1)
	go func() { answered <- cc.await(ctx, line, taken) }() // not in the line: a combined claim took it
	select {
	case err := <-answered:
		t.Fatalf("a claim taken into a combined claim returned before its answer: %v", err)
	case <-time.After(50 * time.Millisecond):
	}
	close(taken.done)
	if err := <-answered; err != nil {
		t.Fatalf("answered: %v", err)
	}

	lead := &claimCall{done: make(chan struct{}), lead: true}
	close(lead.done)
	line.waiting = []*claimCall{lead}
	if err := cc.await(ctx, line, lead); err != nil {
		t.Fatalf("the next maker: %v", err)
	}
}
