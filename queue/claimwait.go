package queue

import (
	"context"
	"slices"
	"sync"
	"time"
)

// External claims of one queue that find nothing to claim wait in a line
// of their Client (the HTTP API's sessions: one long poll each). Only the
// first of them, the leader, waits on the queue's watch and claims again
// when something may have become claimable, or again a moment after
// losing a race for tasks; the others wait in the process for their turn.
// Without the line every waiting claim did both: with 64 long polls and
// one task at a time, each task woke all of them into a claim of their own
// (a read of the queue and of a segment's state, and a losing write for
// all but one), and those that lost went on trying every few milliseconds
// for as long as tasks kept coming.
//
// When the leader stops waiting (it has tasks, its wait ran out or its
// caller left), the line moves on in one of two ways:
//   - its claim took as many tasks as it asked for, so more may be there:
//     every claim in line is woken to claim at once (the claim combiner
//     makes their concurrent claims one request) and whichever still
//     finds nothing lines up again;
//   - otherwise the next claim in line leads and claims at once.
//
// So a claim that waits is always either the leader or behind one that
// will claim for the queue within a round trip of anything claimable
// appearing, and the line costs the store one claim per wake instead of
// one per waiting claim.
type claimWaits struct {
	mu     sync.Mutex
	queues map[string]*waitLine
}

// waitLine is the claims of one queue waiting: whether one leads, and the
// others, in the order they came.
type waitLine struct {
	led     bool
	waiting []chan bool
}

// join returns when the claim may go on: lead is true when it leads the
// line of queue q (it must call leave once it stops waiting), at once
// (waited false) when none led, else when the lead was passed to it; lead
// is false when the leader woke every claim in line. ok is false when ctx
// ended or the deadline passed first: the claim is out of the line.
func (cw *claimWaits) join(ctx context.Context, q string, deadline time.Time) (lead, waited, ok bool) {
	cw.mu.Lock()
	if cw.queues == nil {
		cw.queues = map[string]*waitLine{}
	}
	line := cw.queues[q]
	if line == nil {
		line = &waitLine{}
		cw.queues[q] = line
	}
	if !line.led {
		line.led = true
		cw.mu.Unlock()
		return true, false, true
	}
	turn := make(chan bool, 1)
	line.waiting = append(line.waiting, turn)
	cw.mu.Unlock()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case lead := <-turn:
		return lead, true, true
	case <-ctx.Done():
	case <-t.C:
	}
	cw.mu.Lock()
	if i := slices.Index(line.waiting, turn); i >= 0 {
		line.waiting = slices.Delete(line.waiting, i, i+1)
		cw.mu.Unlock()
		return false, true, false
	}
	cw.mu.Unlock()
	// The turn came as the wait ended: a lead is passed on, never dropped.
	if <-turn {
		cw.leave(q, false)
	}
	return false, true, false
}

// leave ends the lead of queue q's line: when full (the leader's claim
// took all it asked for) every claim in line is woken, else the next one
// leads.
func (cw *claimWaits) leave(q string, full bool) {
	cw.mu.Lock()
	defer cw.mu.Unlock()
	line := cw.queues[q]
	if line == nil {
		return
	}
	switch {
	case len(line.waiting) == 0:
		delete(cw.queues, q) // the map keeps only queues with claims waiting
	case full:
		for _, turn := range line.waiting {
			turn <- false
		}
		delete(cw.queues, q)
	default:
		next := line.waiting[0]
		line.waiting = line.waiting[1:]
		next <- true
	}
}
