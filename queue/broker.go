package queue

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// promoteEvery is how often the external claims of one Client move a
// queue's due retries back to pending, at most (besides when a retry they
// know of falls due): a claim reads the retry schedule only then, so a
// retry another process scheduled may wait this much longer.
const promoteEvery = 250 * time.Millisecond

// broker is the state that the claims and reports of a Client's external
// workers share: the turn that spreads the claims over a queue's open
// segments, what each session's claims carry from one to the next, per
// queue when its due retries were last moved back to pending and when
// the next falls due; the combining of concurrent claims and reports; the
// line of claims that wait for work; and the memory of the runs claimed.
// The zero value is ready; a Client holds one.
type broker struct {
	client *Client // the Client it serves

	turns atomic.Uint64
	// attempts counts the claims external claims made (tries of the
	// store, not calls of Claim).
	attempts atomic.Int64
	mu       sync.Mutex
	due      map[string]dueState
	hot      map[hotKey]sessionClaims
	// levels keeps each queue's anti-starvation turns (levelTurns) from
	// one external claim to the next: each claim has a claimer of its own.
	levels map[string]levelTurns
	// windows keeps each queue's bound on the read of its open segments
	// (openWindow) from one external claim to the next: without it every
	// claim read the open segments unbounded, and etcd counts every key of
	// that range, deleted ones too until compaction.
	windows map[string]openWindow

	// reports combines concurrent reports of outcomes (brokerreport.go).
	reports reportCombiner
	// claims remembers the runs of external claims (brokermemory.go).
	claims claimCache
	// claimers combines concurrent external claims (brokerclaim.go).
	claimers claimCombiner
	// waits lines up external claims that wait for work (below).
	waits claimWaits
}

// levelTurnsOf returns the turns the last external claim of queue q left.
func (b *broker) levelTurnsOf(q string) levelTurns { return loadFor(&b.mu, &b.levels, q) }

// setLevelTurns keeps the turns an external claim of queue q leaves.
func (b *broker) setLevelTurns(q string, lt levelTurns) {
	storeFor(&b.mu, &b.levels, q, lt)
}

// windowOf returns the open window the last external claim of queue q
// left.
func (b *broker) windowOf(q string) openWindow { return loadFor(&b.mu, &b.windows, q) }

// setWindow keeps the open window an external claim of queue q leaves.
func (b *broker) setWindow(q string, ow openWindow) { storeFor(&b.mu, &b.windows, q, ow) }

// loadFor returns queue q's value in *m, read under mu.
func loadFor[T any](mu *sync.Mutex, m *map[string]T, q string) T {
	mu.Lock()
	defer mu.Unlock()
	return (*m)[q]
}

// storeFor sets queue q's value in *m under mu; the map starts over past
// 4,096 queues, so that it stays bounded.
func storeFor[T any](mu *sync.Mutex, m *map[string]T, q string, v T) {
	mu.Lock()
	defer mu.Unlock()
	if *m == nil || len(*m) >= 4096 {
		*m = map[string]T{}
	}
	(*m)[q] = v
}

// hotKey names the claims of one session (lease) from one queue.
type hotKey struct {
	q     string
	lease int64
}

// sessionClaims is what one session's claims of a queue carry from one to
// the next, as a Worker's claim loop keeps it: the segment the last took
// from, if it had slots left (the next claim reads it with its first
// read); that segment's state as the claim left it, when known (the next
// claim takes from it without reading first, claimPredicted); and how many
// claims the session made (one in readEvery reads first all the same).
type sessionClaims struct {
	hot    string
	st     *segState
	claims int64
}

// sessionOf returns what the last claim of lease from queue q left.
func (b *broker) sessionOf(q string, lease int64) sessionClaims {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.hot[hotKey{q, lease}]
}

// setSession keeps what a claim of lease from queue q leaves; a session
// with no segment with slots left keeps only its count of claims.
func (b *broker) setSession(q string, lease int64, sc sessionClaims) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if sc.hot == "" || sc.st == nil || sc.st.name != sc.hot {
		sc.st = nil
	}
	if b.hot == nil || len(b.hot) >= 4096 {
		b.hot = map[hotKey]sessionClaims{}
	}
	b.hot[hotKey{q, lease}] = sc
}

// dueState is when a queue's due items were last moved, when its next
// retry or scheduled segment falls due (zero: none was scheduled), the
// time up to which each of its two indexes was moved (the next read
// starts there, less promoteSlack), and when they were last read from
// their first item.
type dueState struct {
	checked, next        time.Time
	retryDone, schedDone time.Time
	sleepDone, waitDone  time.Time
	full                 time.Time
}

// promoteSlack is how far before where it left off a claim reads a due
// index again: a retry or a segment put due within it while the last read
// ran, or by a submitter whose clock is that much behind, is still moved.
// promoteFullEvery is how often the read starts at the index's first item
// all the same, for one put due earlier still.
const (
	promoteSlack     = time.Second
	promoteFullEvery = time.Minute
)

// from is where the next read of an index that was moved up to done
// starts: zero (the first item) for none yet or for a full read.
func (d dueState) from(done time.Time, full bool) time.Time {
	if done.IsZero() || full {
		return time.Time{}
	}
	return done.Add(-promoteSlack)
}

// promoteDue moves queue q's due retries back to pending and its due
// scheduled segments to the open segments, unless that was done less than
// promoteEvery ago and no item known fell due since; it returns when the
// next falls due (zero: none known). Each index is read from where the
// last move of the queue left it (less promoteSlack), and from its first
// item every promoteFullEvery: the external claims have no watch of it
// that would show a put due before that (a Worker's due.Index has).
func (b *broker) promoteDue(ctx context.Context, w *claimer, q string) (time.Time, error) {
	now := time.Now()
	b.mu.Lock()
	d, ok := b.due[q]
	b.mu.Unlock()
	if ok && now.Sub(d.checked) < promoteEvery && (d.next.IsZero() || now.Before(d.next)) {
		return d.next, nil
	}
	full := now.Sub(d.full) >= promoteFullEvery
	next, retryDone, _, err := b.client.retryIndex(q, w.logger).PromoteFrom(ctx, d.from(d.retryDone, full))
	if err != nil {
		return time.Time{}, err
	}
	nextSleep, sleepDone, _, err := b.client.sleepIndex(q, w.logger).PromoteFrom(ctx, d.from(d.sleepDone, full))
	if err != nil {
		return time.Time{}, err
	}
	if next.IsZero() || !nextSleep.IsZero() && nextSleep.Before(next) {
		next = nextSleep
	}
	nextWait, waitDone, _, err := b.client.waitIndex(q, w.logger).PromoteFrom(ctx, d.from(d.waitDone, full))
	if err != nil {
		return time.Time{}, err
	}
	if next.IsZero() || !nextWait.IsZero() && nextWait.Before(next) {
		next = nextWait
	}
	nextSeg, schedDone, _, err := b.client.scheduledIndex(q).PromoteFrom(ctx, d.from(d.schedDone, full))
	if err != nil {
		return time.Time{}, err
	}
	if next.IsZero() || !nextSeg.IsZero() && nextSeg.Before(next) {
		next = nextSeg
	}
	d = dueState{checked: now, next: next, retryDone: retryDone, sleepDone: sleepDone, waitDone: waitDone, schedDone: schedDone, full: d.full}
	if full {
		d.full = now
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.due == nil || len(b.due) >= 1024 {
		b.due = map[string]dueState{}
	}
	b.due[q] = d
	return next, nil
}

// retryAt notes that a retry, a sleep or a scheduled segment of queue q falls due
// at at, so that a claim moves it then, and reads the indexes from before
// it.
func (b *broker) retryAt(q string, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.due[q]
	if !ok {
		return
	}
	if d.next.IsZero() || at.Before(d.next) {
		d.next = at
	}
	if at.Before(d.retryDone) {
		d.retryDone = at
	}
	if at.Before(d.sleepDone) {
		d.sleepDone = at
	}
	if at.Before(d.waitDone) {
		d.waitDone = at
	}
	if at.Before(d.schedDone) {
		d.schedDone = at
	}
	b.due[q] = d
}

// awaitWork blocks for at most d, and not past due (when a known retry
// falls due), until something may have become claimable in the queue after
// revision rev (see waitForWork), or a retry was scheduled (it may fall due
// before d ends).
func (w *claimer) awaitWork(ctx context.Context, rev int64, d time.Duration, due time.Time) {
	if !due.IsZero() {
		d = min(d, time.Until(due)+time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	q := w.queue
	wt := w.waitAfterClaim(rev) // a segment opened while no wait was open too (claimWait)
	defer wt.Stop()
	retries, dues, sleeps, waits := w.keys.QueueRetry(q), w.keys.QueueDue(q), w.keys.QueueSleep(q), w.keys.QueueWait(q)
	for {
		select {
		case <-wt.C():
			evs, missed := wt.Take()
			if woke := w.wakes(evs, false); missed || woke { // events taken in even after a miss
				return
			}
			for _, ev := range evs {
				if ev.Type != clientv3.EventTypePut || !ev.IsCreate() {
					continue
				}
				for _, pre := range []string{retries, dues, sleeps, waits} {
					if !strings.HasPrefix(string(ev.Kv.Key), pre) {
						continue
					}
					// A retry or a delayed segment scheduled (perhaps by
					// another process): the next claim moves it when it
					// falls due, rather than after its promotion interval
					// or the end of this wait.
					if at, _, ok := keyspace.ParseTimedKey(pre, string(ev.Kv.Key)); ok {
						w.client.remote.retryAt(q, time.Unix(0, at))
					}
					return
				}
			}
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

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

// closeDone closes the segments segs (queue and name) that are finished:
// their states read in one request, and the finished ones closed in one
// more, each as a nested transaction fenced as closeSegment is. A combined
// report that finished many one-task segments read and closed them one
// after the other, two round trips each, and every report waiting behind
// it waited for all of them.
func (c *Client) closeDone(ctx context.Context, segs [][2]string) {
	// Once each: one request may not write a key twice.
	seen := make(map[[2]string]bool, len(segs))
	segs = slices.DeleteFunc(slices.Clone(segs), func(s [2]string) bool {
		dup := seen[s]
		seen[s] = true
		return dup
	})
	perRead := 120 / len(c.stateOps("", "")) // within etcd's 128 operations a request
	for from := 0; from < len(segs); from += perRead {
		part := segs[from:min(from+perRead, len(segs))]
		var ops []clientv3.Op
		for _, s := range part {
			ops = append(ops, c.stateOps(s[0], s[1])...)
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return // whoever changes these segments next closes them
		}
		var closes []clientv3.Op
		rs := resp.Responses
		for _, s := range part {
			k := len(c.stateOps(s[0], s[1]))
			if st := c.parseState(s[0], s[1], resp.Header.Revision, rs[:k]); st.open && st.done() {
				cmps, then := c.closeOps(s[0], st)
				closes = append(closes, clientv3.OpTxn(cmps, then, nil))
			}
			rs = rs[k:]
		}
		if len(closes) > 0 {
			_, _ = c.cli.Txn(ctx).Then(closes...).Commit() // each refused alone if changed since
		}
	}
}
