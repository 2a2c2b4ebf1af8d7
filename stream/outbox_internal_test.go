package stream

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// TestEmitQueueAllocatesNothing: queueing an event while the attempt's
// sender is busy, the steady state of a stream emitting as fast as its
// writes go, allocates nothing: the outbox reuses the room of the batch
// it sent (an allocation during a GC cycle pays for marking: a handler's
// Emit took tens of ms at p99 under load when it allocated).
func TestEmitQueueAllocatesNothing(t *testing.T) {
	sent, next := make(chan int), make(chan struct{})
	o := &outbox{send: func(b []Input) error { sent <- len(b); <-next; return nil }}
	ctx := context.Background()
	ins := []Input{{Type: "token", Data: json.RawMessage(`{"text":"a"}`)}}
	if err := o.put(ctx, ins); err != nil { // starts the sender
		t.Fatal(err)
	}
	<-sent
	// Each round: an event is queued while the sender's write is under
	// way; the write ends and the sender takes that event next.
	allocs := testing.AllocsPerRun(100, func() {
		if err := o.put(ctx, ins); err != nil {
			t.Fatal(err)
		}
		next <- struct{}{}
		if n := <-sent; n != 1 {
			t.Fatalf("a batch of %d events, want 1", n)
		}
	})
	close(next)
	if err := o.flush(ctx); err != nil {
		t.Fatal(err)
	}
	if allocs > 0 {
		t.Fatalf("queueing an event allocated %.1f times, want 0", allocs)
	}
}

// TestReusedBatchSendsTheQueuedEvents: across bursts, each sent while
// the sender's write before is under way, send gets exactly the events
// queued meanwhile, in order, in the room of a batch sent before (its
// reuse hands on none of that batch's events, nor loses one).
func TestReusedBatchSendsTheQueuedEvents(t *testing.T) {
	type batch struct {
		types []string
		room  *Input // the batch's first element: its room
	}
	sent, next := make(chan batch), make(chan struct{})
	o := &outbox{send: func(b []Input) error {
		x := batch{room: &b[:1][0]}
		for _, in := range b {
			x.types = append(x.types, in.Type)
		}
		sent <- x
		<-next
		return nil
	}}
	ctx := context.Background()
	if err := o.put(ctx, []Input{{Type: "start"}}); err != nil { // starts the sender
		t.Fatal(err)
	}
	<-sent
	rooms := map[*Input]int{}
	for burst, size := range []int{3, 1, 7, 2, 5, 5, 1, 9} {
		var want []string
		for i := range size { // queued while the write before is under way
			typ := fmt.Sprintf("b%d-%d", burst, i)
			want = append(want, typ)
			if err := o.put(ctx, []Input{{Type: typ}}); err != nil {
				t.Fatal(err)
			}
		}
		next <- struct{}{}
		got := <-sent
		if !slices.Equal(got.types, want) {
			t.Fatalf("burst %d: sent %v, want %v", burst, got.types, want)
		}
		rooms[got.room]++
	}
	close(next)
	if err := o.flush(ctx); err != nil {
		t.Fatal(err)
	}
	reused := false
	for _, n := range rooms {
		reused = reused || n > 1
	}
	if !reused {
		t.Fatalf("no batch's room was reused (%d rooms for 8 bursts): the test did not test reuse", len(rooms))
	}
}
