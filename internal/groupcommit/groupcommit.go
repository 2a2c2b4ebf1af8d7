// Package groupcommit queues the callers that want to send work to etcd
// while another is sending (group commit): the first to arrive sends at
// once, alone; those that arrive meanwhile wait, and when the send is
// done the first of them sends for as many of them as the next request
// takes. Nobody waits for a timer, so a caller alone pays nothing, and
// callers that come together share a request's fixed cost (a round trip,
// a raft entry, an fsync).
//
// It serves the queue's combined outcome reports and the lock Batcher.
// No library offers this for etcd clients, so it is written here.
package groupcommit

import (
	"context"
	"slices"
	"sync"
)

// Line is the callers of one kind of request. The zero value is ready.
type Line[T any] struct {
	mu      sync.Mutex
	busy    bool
	waiting []*Call[T]
}

// Call is one caller's item in a Line.
type Call[T any] struct {
	// Item is what the caller wants sent; the sender writes the answer
	// into it (a pointer type) before Answer.
	Item T
	lead bool
	done chan struct{}
}

// Join queues item and blocks until either its batch was sent by another
// caller (lead false: the answer is in the item) or the caller is to send
// the next batch itself (lead true: call Take, send, Answer, HandOn). It
// never blocks on a context: the sender always answers, and must bound its
// send.
func (l *Line[T]) Join(item T) (lead bool) {
	lead, _ = l.JoinContext(context.Background(), item)
	return lead
}

// JoinContext is Join, except that a caller still waiting in line when
// ctx ends leaves it, its item unsent, with ctx's error. A caller whose
// item a sender has taken (it is being sent), or who was made the next
// sender, waits on as in Join: its item may be sent, so it must have the
// answer, and the sender bounds its send.
func (l *Line[T]) JoinContext(ctx context.Context, item T) (lead bool, err error) {
	c := &Call[T]{Item: item, done: make(chan struct{})}
	l.mu.Lock()
	l.waiting = append(l.waiting, c)
	if !l.busy {
		l.busy = true
		l.mu.Unlock()
		return true, nil
	}
	l.mu.Unlock()
	select {
	case <-c.done:
		return c.lead, nil
	case <-ctx.Done():
	}
	l.mu.Lock()
	select {
	case <-c.done: // made the sender (HandOn closes under the lock)
		l.mu.Unlock()
		return c.lead, nil
	default:
	}
	if i := slices.Index(l.waiting, c); i >= 0 { // not taken: leave unsent
		l.waiting = slices.Delete(l.waiting, i, i+1)
		l.mu.Unlock()
		return false, ctx.Err()
	}
	l.mu.Unlock()
	<-c.done // taken into a batch being sent: wait for its answer
	return c.lead, nil
}

// Take removes from the waiting callers the items of the next batch, the
// sender's first: fits says, in order, whether one more goes in (given
// the items taken so far); those it refuses wait for a later batch.
func (l *Line[T]) Take(fits func(taken []T, next T) bool) (items []T, calls []*Call[T]) {
	l.mu.Lock()
	defer l.mu.Unlock()
	var left []*Call[T]
	for _, c := range l.waiting {
		if len(calls) > 0 && !fits(items, c.Item) {
			left = append(left, c)
			continue
		}
		items, calls = append(items, c.Item), append(calls, c)
	}
	l.waiting = left
	return items, calls
}

// Answer wakes the callers of calls but the first, the sender: their
// answers are in their items.
func Answer[T any](calls []*Call[T]) {
	for _, c := range calls[1:] {
		close(c.done)
	}
}

// HandOn makes the first waiting caller the sender of the next batch, or
// ends the sending when none waits. The sender calls it once it is done.
func (l *Line[T]) HandOn() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.waiting) == 0 {
		l.busy = false
		l.waiting = nil
		return
	}
	next := l.waiting[0]
	next.lead = true
	close(next.done)
}
