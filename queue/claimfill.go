package queue

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// maxFillRounds bounds the further claims one Claim makes to fill up to
// its Max: each is one segment's, so it bounds the segments one Claim
// reads past its first.
const maxFillRounds = 16

// fill tops up tasks, what an external claim of up to n tasks of queue q
// took with claims, from further segments: a claim with Max 10 of 4
// pending tasks in two segments takes the 4, not the first segment's 2.
// It claims again while the last claim used up its segment's free slots
// (or took tasks with records of their own, which go before any
// segment's) and another segment may have tasks: one the claim's list of
// open segments showed and it did not take from. A claim that read no
// list (a session going on where it took from) is not topped up: its next
// claim lists. Each further claim is an ordinary claim
// (fenced, one holder per task, by the priority rule) of one segment: it
// costs that segment's round trips, never one per task, and none when the
// claim's list showed no other open segment. An error of a further claim
// ends the filling; the tasks already claimed are answered.
func (b *broker) fill(ctx context.Context, w *claimer, q string, n int, claims []*claim, tasks []*Task, l clientv3.LeaseID) []*Task {
	taken := map[string]bool{}
	for round := 0; round < maxFillRounds && len(tasks) < n && ctx.Err() == nil && !w.fifo.Load(); round++ {
		for _, cl := range claims {
			if cl.run != nil {
				taken[cl.run.seg] = true
			}
		}
		seg, guessed := w.hotSegment(0)
		switch {
		case seg != "" && (guessed || fromRecords(claims)):
			// The next segment of the list, or the segment the session
			// takes from: claim from it.
		case seg != "":
			return tasks // slots left where it took from, yet fewer taken: others won them
		default:
			next, _ := w.otherListed(taken)
			if next == "" {
				// The list showed no other open segment, or the claim
				// read none (a session going on where it took from):
				// listing again would cost a round per short claim,
				// which a trickle of tasks makes every claim.
				return tasks
			}
			for s := range taken {
				w.markBusy(s) // used up: a list read skips them
			}
			w.setGuess(0, next)
		}
		b.attempts.Add(1)
		more, _, _, err := w.claim(ctx, 0, n-len(tasks))
		if err != nil || len(more) == 0 {
			return tasks
		}
		got, err := b.runnable(ctx, w, more, l)
		if err != nil {
			return tasks
		}
		b.claims.remember(func(seg string) string { return b.client.keys.Runs(q, seg) }, q, more, got, l)
		tasks, claims = append(tasks, got...), more
	}
	return tasks
}

// otherListed returns an open segment of the claimer's list read that is
// not in taken nor known busy; known: the list was read, and held every
// open segment (it was not cut at openRead), so "" means none is left.
func (w *claimer) otherListed(taken map[string]bool) (seg string, known bool) {
	now := time.Now()
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	for _, name := range w.listedAll {
		if until, busy := w.busySegs[name]; taken[name] || (busy && now.Before(until)) {
			continue
		}
		return name, true
	}
	return "", w.listedAll != nil && len(w.listedAll) < openRead
}

// fromRecords reports whether claims took tasks with records of their own
// (back from a retry, a requeue or a hand-back).
func fromRecords(claims []*claim) bool {
	for _, cl := range claims {
		if cl.run == nil {
			return true
		}
	}
	return false
}
