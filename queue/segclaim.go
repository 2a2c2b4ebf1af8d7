package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// segRun is a run this worker holds: slots of one segment claimed with one
// lease-bound key, whose create revision fences every outcome written for
// them.
type segRun struct {
	seg            string
	runKey, tryKey string
	token          int64
	claimedAt      time.Time
	v              runValue // what the run holds
	// remaining counts the run's outcomes not yet given to its writer;
	// the batch that takes the last one deletes the run.
	remaining atomic.Int32
	outSeq    atomic.Int64
	// last says the claim took one of the segment's last runs of free
	// slots: once the run ends, the segment may be finished.
	last bool
	// writer is the outcome writer that writes all of the run's outcomes,
	// in order (a run's last batch deletes it).
	writer int
	// lost says an outcome of the run could not be written: the run is
	// not deleted, so that its tasks keep their attempts when the lease
	// ends.
	lost atomic.Bool
	// exact says an exit of the segment since the claim refused an
	// outcome batch of the run: its later batches compare each slot's
	// exit (runReqs), which that exit would refuse every time.
	exact atomic.Bool
}

// openRead is how many open segments a claim reads at a time.

const openRead = 32

// segmentRead is what a claim's first read saw of the segments: the first
// open ones (when listed), the state of the segment the claim loop took
// from last (hot, nil for none), whether the queue is FIFO, and the claim's
// sequence number.
type segmentRead struct {
	open   []*mvccpb.KeyValue
	listed bool
	// bounded: the list was read within the open window (see openWindow).
	bounded bool
	hot     *segState
	fifo    bool
	seq     int64
}

// claimSegments claims up to n tasks from queue's segments: from a segment a
// dead worker left tasks in first, then from the segment the claim loop
// took from last, else from the open segments that the priority rule picks.
func (w *claimer) claimSegments(ctx context.Context, lane, n int, r segmentRead) (claims []*claim, contended bool, err error) {
	claims, contended, err = w.claimListed(ctx, lane, n, r)
	if err == nil && len(claims) == 0 && !contended && r.listed && r.bounded {
		// The window held only segments with nothing to claim (a long
		// task keeps the oldest open): segments submitted after its end
		// were not read. Read on to the last before waiting, or a claim
		// woken by a new segment would not see it.
		w.levelMu.Lock()
		w.window.widen()
		w.levelMu.Unlock()
		return nil, true, nil
	}
	return claims, contended, err
}

// claimListed is claimSegments from what r read.
func (w *claimer) claimListed(ctx context.Context, lane, n int, r segmentRead) (claims []*claim, contended bool, err error) {
	if claims, ok, err := w.claimLost(ctx, lane, n); ok || err != nil {
		return claims, true, err // a dead worker's tasks first
	}
	if r.hot != nil && r.listed && !w.stillFirst(lane, r) {
		r.hot = nil // a higher level, or a lower level's turn: the rule picks
		w.setHot(lane, "")
	}
	if claims, ok, err := w.claimHot(ctx, lane, n, r.hot, r.fifo); ok || err != nil || !r.listed {
		return claims, true, err // (without the list: claim again with it)
	}
	open, fifo, seq := r.open, r.fifo, r.seq
	if !fifo {
		w.listed(open)
	}
	// Segments whose slots all run are marked busy as they are found, so
	// each round reads on past them: a pending task behind many running
	// segments is found now, not when a timer fires.
	for round := 0; round < 8; round++ {
		cands, err := w.pickSegments(ctx, open, fifo, r.bounded, seq)
		if !fifo {
			cands = w.notOthersHot(lane, cands)
		}
		if err != nil || len(cands) == 0 {
			return nil, contended, err
		}
		if !fifo && len(cands) > 1 {
			claims, c, err := w.claimSeveral(ctx, lane, cands, n, open)
			if err != nil || len(claims) > 0 {
				return claims, false, err
			}
			if contended = contended || c; contended || !w.allBusy(cands) {
				return nil, contended, nil
			}
			continue
		}
		busy := 0
		for _, seg := range cands {
			claims, c, err := w.claimSegment(ctx, lane, seg, n)
			if len(claims) > 0 && !fifo && w.belowTop(seg, open) {
				// A lower level's turn: the loop's next claim must not
				// take from this segment again without the rule.
				w.setHot(lane, "")
			}
			if err != nil || len(claims) > 0 {
				return claims, false, err
			}
			contended = contended || c
			if w.isBusy(seg) {
				busy++
			}
		}
		if contended || busy < len(cands) {
			return nil, contended, nil
		}
	}
	return nil, true, nil // still only busy segments: claim again, reading on
}

// severalMax is the most segments one claim reads and takes from at once
// (claimSeveral): their states, seven reads each, fit etcd's 128
// operations a request.
const severalMax = 16

// claimSeveral claims up to n tasks from the segments cands, in that
// order, in two requests: one reads their states, one makes a run in each
// that has free slots until n are taken, each run a nested transaction
// fenced as claimSegment's, so a run refused (others won its slots) takes
// nothing and the others stand. Segments of a few tasks each (delayed
// tasks submitted over a spread of times fall due in small groups) cost
// the claim two round trips in all, not two per segment. open is the list
// read the candidates came from.
func (w *claimer) claimSeveral(ctx context.Context, lane int, cands []string, n int, open []*mvccpb.KeyValue) (claims []*claim, contended bool, err error) {
	q := w.queue
	states, tss, err := w.client.readStates(ctx, q, cands)
	if err != nil {
		return nil, false, fmt.Errorf("queue: read segments of %s: %w", q, err)
	}
	var runs []*runClaim
	for i, st := range states {
		left := n
		for _, rc := range runs {
			left -= len(rc.pick)
		}
		if left <= 0 {
			break
		}
		free, c := w.freeSlots(ctx, lane, st, tss[i])
		contended = contended || c
		if len(free) == 0 {
			continue
		}
		pick := free[:min(left, len(free))]
		rc := w.prepareRun(st, tss[i], pick, len(free)-len(pick) < 2*n)
		rc.free = free
		runs = append(runs, rc)
	}
	if len(runs) == 0 {
		return nil, contended, nil
	}
	claims, c, err := w.takeRuns(ctx, runs)
	if len(claims) == 0 {
		w.setHot(lane, "")
		return nil, contended || c, err
	}
	last := runs[len(runs)-1]
	for _, rc := range runs[:len(runs)-1] {
		w.markBusy(rc.st.name) // every free slot taken
	}
	switch {
	case last.made && len(last.free) > len(last.pick):
		w.setPredicted(lane, last.st.after(last.made0, w.keys.Runs(q, last.st.name), last.pick))
	case last.made:
		w.markBusy(last.st.name)
		w.setGuess(lane, w.nextListed(lane, last.st.name))
	default:
		w.setHot(lane, "")
	}
	if w.belowTop(runs[0].st.name, open) {
		w.setHot(lane, "") // a lower level's turn: the next claim follows the rule
	}
	return claims, c, err
}

// freeSlots returns the slots of segment st (whose tasks are ts) a claim
// may take, a dead worker's first; contended says the segment changed
// since it was listed (closed, or finished and closed now).
func (w *claimer) freeSlots(ctx context.Context, lane int, st *segState, ts []Task) (free []int, contended bool) {
	switch {
	case ts == nil:
		w.markBusy(st.name) // removed, or undecodable: then quarantined
		if st.open {
			w.quarantineIfUndecodable(ctx, st.name)
		}
		return nil, false
	case !st.open:
		w.markBusy(st.name)
		return nil, true
	case st.unreadable > 0:
		w.logger.Warn("queue: a segment holds state this worker cannot read; skipping it", "queue", w.queue, "segment", st.name, "values", st.unreadable)
		w.markBusy(st.name)
		return nil, false
	}
	all := st.free()
	free = w.withoutRunnerHeldSlots(ts, all)
	if len(free) == 0 {
		if len(all) == 0 {
			w.markBusy(st.name)
		}
		if st.done() {
			w.client.closeSegment(ctx, w.queue, st)
			return nil, true
		}
		return nil, false
	}
	sort.SliceStable(free, func(i, j int) bool { return st.attempts(free[i]) > st.attempts(free[j]) })
	return free, false
}

// takeRuns writes runs in one request; see claimSeveral. contended: some
// run was refused for a change of its segment.
func (w *claimer) takeRuns(ctx context.Context, runs []*runClaim) (claims []*claim, contended bool, err error) {
	ops := make([]clientv3.Op, len(runs))
	for i, rc := range runs {
		ops[i] = rc.op()
	}
	// Once sent, the claim may be applied whatever happens to ctx.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	began := time.Now()
	resp, err := w.cli.Txn(cctx).Then(ops...).Commit()
	metrics.ObserveTxn("claim", began)
	cancel()
	if err != nil {
		if !outcomeUnknown(err) {
			return nil, false, err
		}
		for _, rc := range runs {
			if got := rc.resolve(); len(got) > 0 {
				rc.made, rc.made0 = true, got[0].run
				claims = append(claims, got...)
			}
		}
		if len(claims) > 0 {
			return claims, false, nil
		}
		return nil, false, err
	}
	for k, rc := range runs {
		made, runnerHeld := rc.result(resp.Responses[k].GetResponseTxn())
		if runnerHeld {
			rc.findRunners(ctx)
		}
		if !made {
			contended = contended || !runnerHeld
			continue
		}
		got := rc.claimed(resp.Header.Revision)
		rc.made, rc.made0 = true, got[0].run
		claims = append(claims, got...)
	}
	return claims, contended, nil
}

// allBusy reports whether every segment of segs is marked busy.
func (w *claimer) allBusy(segs []string) bool {
	for _, seg := range segs {
		if !w.isBusy(seg) {
			return false
		}
	}
	return true
}

// belowTop reports whether segment seg is of a lower priority level than
// the first of the open segments open (a list read, highest level first):
// a lower level's turn took it.
func (w *claimer) belowTop(seg string, open []*mvccpb.KeyValue) bool {
	if len(open) == 0 {
		return false
	}
	top, _ := keyspace.Last(w.keys.SegmentsOpen(w.queue), string(open[0].Key))
	tl, ok1 := keyspace.SegmentLevel(top)
	sl, ok2 := keyspace.SegmentLevel(seg)
	return ok1 && ok2 && sl != tl
}

// claimLost claims from the segment a dead worker's run left tasks in, if
// any; ok says it claimed, or found others racing for them.
func (w *claimer) claimLost(ctx context.Context, lane, n int) (claims []*claim, ok bool, err error) {
	seg := w.lostSegs.first()
	if seg == "" {
		return nil, false, nil
	}
	claims, contended, err := w.claimSegment(ctx, lane, seg, n)
	return claims, len(claims) > 0 || contended, err
}

// claimSegment claims up to n free slots of segment seg in one transaction:
// a run key bound to the lease and its durable twin, the try, which keeps
// the attempts when the worker dies. The transaction requires that no run
// was made, no outcome of a run made since written and no slot exited since
// the segment's state was read, that the segment is open, and that no task runner holds any of
// the tasks.
func (w *claimer) claimSegment(ctx context.Context, lane int, seg string, n int) (claims []*claim, contended bool, err error) {
	q := w.queue
	ops := w.client.stateOps(q, seg)
	ts, cached := w.client.segCache.get(q + "/" + seg)
	if !cached {
		ops = append(ops, clientv3.OpGet(w.keys.Segment(q, seg)))
	}
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, false, fmt.Errorf("queue: read segment %s of %s: %w", seg, q, err)
	}
	st := w.client.parseState(q, seg, resp.Header.Revision, resp.Responses)
	if !cached {
		kvs := resp.Responses[len(ops)-1].GetResponseRange().Kvs
		if len(kvs) == 0 {
			w.markBusy(seg)
			return nil, false, nil // removed
		}
		if ts, err = w.client.cacheSegment(q, seg, kvs[0].Value); errors.Is(err, errSegmentFormat) {
			w.skipForeign(seg, err) // a newer drover's: not damaged
			return nil, false, nil
		} else if err != nil {
			// It will never decode: out of the claims' way, kept for an
			// operator (a FIFO queue's head would stall every claim).
			return nil, true, w.quarantine(ctx, seg, kvs[0], err) // contended: the list has changed
		}
	}
	return w.claimFrom(ctx, lane, st, ts, n)
}

// claimHot claims from hot, the state of the segment claim loop lane took
// from last, read with the claim's first read; ok false when it has nothing
// to claim (or its records are not at hand) and the claim goes on as usual.
func (w *claimer) claimHot(ctx context.Context, lane, n int, hot *segState, fifo bool) (claims []*claim, ok bool, err error) {
	if hot == nil || fifo {
		return nil, false, nil
	}
	ts, cached := w.client.segCache.get(w.queue + "/" + hot.name)
	if !cached || !hot.open || len(hot.free()) == 0 {
		w.setHot(lane, "")
		return nil, false, nil
	}
	claims, contended, err := w.claimFrom(ctx, lane, hot, ts, n)
	return claims, len(claims) > 0 || contended, err
}

// claimPredicted claims from the segment claim loop lane took from last,
// without reading it first: its state is what the loop's last claim left,
// and the claim's compares (no run or try made, no outcome of a run made
// since and no slot exited since that claim, the segment still open)
// refuse it if anything else changed the segment since. ok false: there was no such
// state, or the claim was refused; claim as usual, reading first.
func (w *claimer) claimPredicted(ctx context.Context, lane, n int) (claims []*claim, ok bool, err error) {
	w.levelMu.Lock()
	st := w.predicted[lane]
	w.levelMu.Unlock()
	if st == nil || w.fifo.Load() || w.lostSegs.first() != "" {
		return nil, false, nil
	}
	ts, cached := w.client.segCache.get(w.queue + "/" + st.name)
	if !cached {
		return nil, false, nil
	}
	claims, _, err = w.claimFrom(ctx, lane, st, ts, n)
	return claims, len(claims) > 0 || err != nil, err
}

// claimFrom claims up to n free slots of segment st, whose tasks are ts.
func (w *claimer) claimFrom(ctx context.Context, lane int, st *segState, ts []Task, n int) (claims []*claim, contended bool, err error) {
	q, seg := w.queue, st.name
	if !st.open {
		w.markBusy(seg)
		w.lostSegs.remove(seg)
		w.setHot(lane, "")
		return nil, true, nil // closed since the list was read: read it again
	}
	if st.unreadable > 0 {
		// A run, try or outcome this worker cannot read (another format):
		// which slots it holds is unknown, so claim none of them.
		w.logger.Warn("queue: a segment holds state this worker cannot read; skipping it", "queue", q, "segment", seg, "values", st.unreadable)
		w.markBusy(seg)
		w.setHot(lane, "")
		return nil, false, nil
	}
	all := st.free()
	free := w.withoutRunnerHeldSlots(ts, all)
	if len(free) == 0 {
		w.lostSegs.remove(seg)
		if len(all) == 0 {
			// Every slot runs. (Slots left out because a task runner
			// held them are tried again after their second, which a
			// segment skipped as busy for longer would not let happen.)
			w.markBusy(seg)
		}
		if st.done() {
			w.client.closeSegment(ctx, q, st)
			return nil, true, nil // finished: the list has changed
		}
		return nil, false, nil
	}
	// A dead worker's tasks first: they have waited longest.
	sort.SliceStable(free, func(i, j int) bool { return st.attempts(free[i]) > st.attempts(free[j]) })
	pick := free[:min(n, len(free))]
	// The runs that take the segment's last slots check, when they end,
	// whether it is finished.
	claims, contended, err = w.takeSlots(ctx, st, ts, pick, len(free)-len(pick) < 2*n)
	if len(claims) == 0 && err == nil && w.client.pauses.since(q) > 0 {
		return nil, false, nil // refused by the pause: a dead worker's tasks here stay first in line
	}
	switch {
	case len(claims) > 0 && len(free) > len(pick):
		// Slots left: the next claim takes from here, most often without
		// reading first.
		w.setPredicted(lane, st.after(claims[0].run, w.keys.Runs(q, seg), pick))
	case len(claims) > 0:
		// The segment's last free slots: the next claim reads the next
		// open segment the last list showed with its first read.
		w.setGuess(lane, w.nextListed(lane, seg))
	default:
		w.setHot(lane, "")
	}
	// A dead worker's tasks stay first in line until none is left here.
	if !(contended && st.attempts(pick[0]) > 0) && (len(free) == len(pick) || st.attempts(free[len(pick)]) == 0) {
		w.lostSegs.remove(seg)
	}
	return claims, contended, err
}

// takeSlots writes the run of pick; see claimSegment.
func (w *claimer) takeSlots(ctx context.Context, st *segState, ts []Task, pick []int, last bool) ([]*claim, bool, error) {
	rc := w.prepareRun(st, ts, pick, last)
	// Once sent, the claim may be applied whatever happens to ctx: do not
	// let a shutdown cut the request short and leave a run nobody knows.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	began := time.Now()
	resp, err := w.cli.Do(cctx, rc.op())
	metrics.ObserveTxn("claim", began)
	cancel()
	if err != nil {
		if !outcomeUnknown(err) {
			return nil, false, err
		}
		if claims := rc.resolve(); len(claims) > 0 {
			return claims, false, nil
		}
		return nil, false, err
	}
	made, runnerHeld := rc.result((*pb.TxnResponse)(resp.Txn()))
	if runnerHeld {
		rc.findRunners(ctx)
	}
	if !made {
		return nil, !rc.paused, nil
	}
	return rc.claimed(resp.Txn().Header.Revision), false, nil
}

// coveredTries returns the tries of dead runs that a claim of pick makes
// useless: every slot of theirs is finished or taken again, so they carry
// nothing the new try does not, and the claim deletes them.
func (s *segState) coveredTries(pick []int) []runRef {
	var out []runRef
	for _, tr := range s.tries {
		if s.liveRun(tr.rest) {
			continue
		}
		covered := true
		for _, slot := range tr.v.Slots {
			if !s.finished(slot) && !slices.Contains(pick, slot) {
				covered = false
				break
			}
		}
		if covered {
			out = append(out, tr)
		}
	}
	return out
}

// after returns the state s is in once run r, of slots pick, was made from
// it, if nothing else changed the segment: the run and its try added, the
// tries the claim deleted gone, read at the run's revision. runs is the
// prefix of the segment's runs.
func (s *segState) after(r *segRun, runs string, pick []int) *segState {
	next := *s
	next.ok = s.okSlots()
	next.rev = r.token
	ref := runRef{key: r.runKey, rest: keyspace.RunNameOf(runs, r.runKey), token: r.token, v: r.v}
	next.runs = append(slices.Clip(s.runs), ref)
	gone := s.coveredTries(pick)
	next.tries = make([]runRef, 0, len(s.tries)+1)
	for _, tr := range s.tries {
		if !slices.ContainsFunc(gone, func(g runRef) bool { return g.key == tr.key }) {
			next.tries = append(next.tries, tr)
		}
	}
	next.tries = append(next.tries, runRef{key: r.tryKey, rest: ref.rest, token: r.token, v: r.v})
	return &next
}

// liveRun reports whether the run named rest (below the segment) still
// exists.
func (s *segState) liveRun(rest string) bool {
	for _, r := range s.runs {
		if r.rest == rest {
			return true
		}
	}
	return false
}

// closeSegment closes segment st when, as read, every slot has finished and
// no run is left: its open key goes and a closed key counts the tasks that
// succeeded in it, unless anything changed since the read. Retention
// removes it later.
func (c *Client) closeSegment(ctx context.Context, q string, st *segState) {
	cmps, then := c.closeOps(q, st)
	resp, err := c.cli.Txn(ctx).If(cmps...).Then(then...).Commit()
	_, _ = resp, err // a change in between: whoever made it closes it later
}

// closeOps are the compares and the writes of closeSegment.
func (c *Client) closeOps(q string, st *segState) ([]clientv3.Cmp, []clientv3.Op) {
	seg := st.name
	return []clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(c.keys.SegmentOpen(q, seg)), ">", 0),
			clientv3.Compare(clientv3.CreateRevision(c.keys.Runs(q, seg)).WithPrefix(), "=", 0),
			clientv3.Compare(clientv3.ModRevision(c.keys.Outs(q, seg)).WithPrefix(), "<", st.rev+1),
			clientv3.Compare(clientv3.ModRevision(c.keys.Exits(q, seg)).WithPrefix(), "<", st.rev+1),
		}, []clientv3.Op{
			clientv3.OpDelete(c.keys.SegmentOpen(q, seg)),
			clientv3.OpDelete(c.keys.Tries(q, seg), clientv3.WithPrefix()),
			clientv3.OpPut(c.keys.SegmentClosed(q, seg, c.now()), fmt.Sprintf("%d", len(st.ok)-st.purgedOK)),
		}
}

// closeFinished closes the finished segments among the first open ones of
// queue q (a segment whose last runs ended on several workers may be left
// open by all of them), and returns how many it closed.
func (c *Client) closeFinished(ctx context.Context, q string) (int, error) {
	g, err := c.cli.Get(ctx, c.keys.SegmentsOpen(q), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
	if err != nil {
		return 0, fmt.Errorf("queue: read open segments of %s: %w", q, err)
	}
	n := 0
	for _, kv := range g.Kvs {
		seg, _ := keyspace.Last(c.keys.SegmentsOpen(q), string(kv.Key))
		st, err := c.readState(ctx, q, seg)
		if err != nil {
			return n, err
		}
		if st.open && st.done() {
			c.closeSegment(ctx, q, st)
			n++
		}
	}
	return n, nil
}
