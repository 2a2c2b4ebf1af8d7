package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claim takes up to n claimable tasks in one transaction: one nested
// transaction per task that succeeds only if its pending key is unchanged
// since it was read and it has no claim, and then writes the claim (bound to
// the lease) and counts the attempt. It reads shards of the pending index,
// a few at a time, starting from a different shard each call, until it has
// enough candidates. It also returns the revision its first read saw, from
// which a watch misses nothing.
func (w *claimer) claim(ctx context.Context, lane, n int) (claims []*claim, rev int64, contended bool, err error) {
	if rev := w.client.pauses.since(w.queue); rev > 0 {
		// Its callers wait for the resume: from the pause's revision, so
		// that a resume already made is not missed.
		return nil, rev, false, nil
	}
	seq := w.claimSeq.Add(1)
	// The priority turns (one claim in eight serves a lower level) count
	// the claims that took something, not the attempts: under load many
	// attempts find nothing (a race lost to the worker's own outcome
	// writer), and counting them would hand the lower levels more turns.
	turn := w.turnSeq.Load() + 1
	defer func() {
		if err == nil && len(claims) > 0 {
			w.turnSeq.Add(1)
		}
	}()
	if w.fifo.Load() {
		// A FIFO queue's claims all want its oldest tasks: the worker's
		// claim loops take turns rather than race each other for them.
		w.fifoMu.Lock()
		defer w.fifoMu.Unlock()
	}
	if ids := w.lost.take(n); len(ids) > 0 {
		// A dead worker's tasks first: they have waited longest.
		cands, err := w.orphanCandidates(ctx, ids)
		if err != nil {
			w.lost.add(ids)
			return nil, 0, false, err
		}
		if len(cands) > 0 {
			claims, err := w.claimKeys(ctx, cands, n, true)
			if rev := w.client.pauses.since(w.queue); len(claims) == 0 && err == nil && rev > 0 {
				w.lost.add(ids) // refused by the pause: they go first after the resume
				return nil, rev, false, nil
			}
			return claims, 0, true, err // contended: claim again at once
		}
	}
	if w.laneClaims[lane].Add(1)%readEvery != 0 {
		if claims, ok, err := w.claimPredicted(ctx, lane, n); ok {
			return claims, 0, false, err
		}
	}
	hot, guessed := w.hotSegment(lane)
	// The open segments' list (etcd counts every key of the range, even
	// with a limit) only when the loop has no segment with slots left, one
	// claim in sixteen, or when its segment is a guess (the next one of
	// its last list), which the priority rule must confirm.
	listOpen := hot == "" || guessed || seq%16 == 0
	levels, fifo, first, open, hotState, err := w.readLevels(ctx, n, hot, listOpen)
	if err != nil {
		if hot != "" {
			w.setHot(lane, "") // its tasks may be what could not be read
		}
		return nil, 0, false, err
	}
	w.fifo.Store(fifo)
	if len(levels) == 0 {
		// No task with a record of its own waits (those back from a
		// retry, a requeue or a hand-back, which go first): claim from
		// the segments.
		claims, contended, err := w.claimSegments(ctx, lane, n, segmentRead{open, listOpen, first.bounded, hotState, fifo, turn})
		return claims, first.rev, contended, err
	}
	cands, rev, err := w.recordCandidates(ctx, n, turn, levels, fifo, first)
	if err != nil {
		return nil, 0, false, err
	}
	if len(cands) == 0 {
		claims, contended, err := w.claimSegments(ctx, lane, n, segmentRead{open, listOpen, first.bounded, hotState, fifo, turn})
		return claims, first.rev, contended, err
	}
	claims, err = w.claimKeys(ctx, cands, n, fifo)
	return claims, rev, len(claims) == 0, err
}

// recordCandidates finds up to about 2n claimable tasks with records of
// their own (back from a retry, a requeue or a hand-back) in the priority
// levels levels, by the priority rule, oldest first, a dead worker's first;
// rev is the revision of its first read.
func (w *claimer) recordCandidates(ctx context.Context, n int, seq int64, levels []level, fifo bool, first *firstRead) (cands []*mvccpb.KeyValue, rev int64, err error) {
	q := w.queue
	var suspects []*mvccpb.KeyValue
	tried := map[string]bool{}
	for {
		lv, ok := w.pickLevel(levels, seq, tried)
		if !ok {
			break
		}
		tried[lv.name] = true
		var covered bool
		var r int64
		cands, suspects, r, covered, err = w.readPending(ctx, n, lv.name, fifo, first)
		first = nil
		if err != nil {
			return nil, 0, err
		}
		if rev == 0 {
			rev = r
		}
		if len(cands) > 0 {
			break
		}
		if len(suspects) > 0 {
			// Only claimed tasks: take those whose worker died.
			orphans, err := w.orphans(ctx, suspects)
			if err != nil {
				return nil, 0, err
			}
			suspects = nil
			if len(orphans) > 0 || lv.name == "" {
				cands = orphans
				break
			}
			w.levelMu.Lock()
			w.busyLevels[lv.name] = time.Now().Add(levelBusyFor) // all running: skip it for a moment
			w.levelMu.Unlock()
			continue
		}
		if lv.name == "" {
			break
		}
		if covered { // empty: its marker goes, unless a task came since it was read
			_, _ = w.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(w.client.levelKey(q, lv.name)), "=", lv.rev)).
				Then(clientv3.OpDelete(w.client.levelKey(q, lv.name))).Commit()
		}
	}
	// A task whose level has no marker (written before markers existed) is
	// found by the all-levels read: give its level one.
	known := make(map[string]bool, len(levels))
	for _, lv := range levels {
		known[lv.name] = true
	}
	var missing []clientv3.Op
	for _, kv := range cands {
		if lv := w.client.levelOfPending(q, string(kv.Key)); lv != "" && !known[lv] {
			known[lv] = true
			missing = append(missing, clientv3.OpPut(w.client.levelKey(q, lv), ""))
		}
	}
	if len(missing) > 0 {
		_, _ = w.cli.Txn(ctx).Then(missing...).Commit()
	}
	// Oldest first within a priority level, across the shards read.
	sort.SliceStable(cands, func(i, j int) bool {
		return w.keys.PendingOrder(q, string(cands[i].Key)) < w.keys.PendingOrder(q, string(cands[j].Key))
	})
	// A claimed task whose claim key is gone (its worker died) is
	// claimable again; such tasks sit at the head of their shards, so look
	// at them first.
	if len(suspects) > 0 {
		orphans, err := w.orphans(ctx, suspects)
		if err != nil {
			return nil, 0, err
		}
		cands = append(orphans, cands...)
	}
	return cands, rev, nil
}

// claimKeys claims up to n of the pending keys cands in one transaction: one
// nested transaction per task that succeeds only if its pending key is
// unchanged since it was read and it has no claim, and then writes the claim
// (bound to the lease) and counts the attempt. Unless ordered, it takes a
// random n of the first 2n, so that workers reading the same keys do not
// all race for the same tasks.
func (w *claimer) claimKeys(ctx context.Context, cands []*mvccpb.KeyValue, n int, ordered bool) ([]*claim, error) {
	q := w.queue
	pre := w.keys.QueuePending(q)
	cands = w.withoutRunnerHeld(cands)
	window := cands[:min(len(cands), 2*n)]
	if !ordered {
		rand.Shuffle(len(window), func(i, j int) { window[i], window[j] = window[j], window[i] })
	}
	pick := window[:min(n, len(window))]
	if len(pick) == 0 {
		return nil, nil
	}
	now := time.Now().UTC()
	ops := make([]clientv3.Op, len(pick))
	ids := make([]string, len(pick))
	attempts := make([]int, len(pick))
	for i, kv := range pick {
		id := pendingID(string(kv.Key), pre)
		var pv pendingValue
		_ = json.Unmarshal(kv.Value, &pv)
		ids[i], attempts[i] = id, pv.Attempts+1
		cv, _ := json.Marshal(claimValue{Worker: w.worker, Attempt: attempts[i], ClaimedAt: now})
		ck := w.keys.QueueClaim(q, id)
		// A task id is held by one claimer at a time, a queue worker or a
		// task runner (package task): no claim while the runner's lock on
		// the id has a holder or a waiter. The runner, for its part, waits
		// for a queue claim to end before it runs.
		runner := taskstore.RunnerLock(w.keys, id)
		ops[i] = clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision), clientv3.Compare(clientv3.CreateRevision(ck), "=", 0),
				taskstore.NoRunner(runner)},
			[]clientv3.Op{clientv3.OpPut(ck, string(cv), clientv3.WithLease(w.lease.ID())), clientv3.OpPut(string(kv.Key), encodePending(attempts[i], true)), clientv3.OpGet(w.keys.TaskRecord(id))},
			[]clientv3.Op{taskstore.CountRunners(runner)})
	}
	// Once sent, the claims may be applied whatever happens to ctx: do not
	// let a shutdown cut the request short and leave claims nobody knows.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	began := time.Now()
	tr, err := w.cli.Txn(cctx).If(w.client.notPaused(q)).Then(ops...).Else(w.client.ifPaused(q)).Commit()
	metrics.ObserveTxn("claim", began)
	cancel()
	if err != nil {
		return nil, err
	}
	if !tr.Succeeded { // the pause fence (pause.go)
		w.client.refusedBy(q, (*clientv3.GetResponse)(tr.Responses[0].GetResponseRange()))
		return nil, nil
	}
	var out []*claim
	for i, r := range tr.Responses {
		sub := r.GetResponseTxn()
		if !sub.Succeeded {
			if sub.Responses[0].GetResponseRange().Count > 0 {
				w.runnerHolds(ids[i]) // a task runner has it: skip it for a while
			}
			continue
		}
		out = append(out, w.claimedRecord(ids[i], attempts[i], string(pick[i].Key), tr.Header.Revision, now, sub.Responses[2].GetResponseRange().Kvs))
	}
	w.claimed.Add(int64(len(out)))
	if len(out) > 0 {
		metrics.ClaimBatchSize.WithLabelValues(q).Observe(float64(len(out)))
	}
	for _, c := range out {
		metrics.TasksClaimed.WithLabelValues(q, c.task.Type).Inc()
	}
	return out, nil
}

// claimedRecord is the claim of task id, made at revision rev (its token)
// and time now from its pending key pendingKey, starting attempt; rec is
// the task's record as the claim read it. A task without a readable
// record is claimed broken, for the dead-letter queue.
func (w *claimer) claimedRecord(id string, attempt int, pendingKey string, rev int64, now time.Time, rec []*mvccpb.KeyValue) *claim {
	c := &claim{claimKey: w.keys.QueueClaim(w.queue, id), pendingKey: pendingKey, token: rev, claimedAt: now}
	t := new(Task)
	switch {
	case len(rec) == 0:
		c.broken = errors.New("the task has no record")
	default:
		if err := json.Unmarshal(rec[0].Value, t); err != nil {
			c.broken = fmt.Errorf("the task's record is unreadable: %w", err)
		}
		c.recRev = rec[0].ModRevision
		fillStoredWait(t) // before the status changes: ScheduledAt is the wait's due time
	}
	if c.broken != nil {
		w.logger.Error("queue: claimed a broken task; sending it to the dead-letter queue", "task", id, "err", c.broken)
		t = &Task{ID: id, Queue: w.queue, Type: "unknown"}
	}
	t.Attempt, t.Token, t.CurrentStatus = attempt, rev, Running
	c.task = t
	return c
}

// readEvery: one claim in readEvery reads the queue first even when its
// loop could claim from the segment it took from last without a read, so
// that tasks with records of their own (back from a retry, a requeue or a
// hand-back), which go first, and a change to the queue's FIFO setting are
// seen within a few claims.
const readEvery = 4

// levelBusyFor is how long a priority level whose tasks are all running is
// skipped before it is read again.
const levelBusyFor = 500 * time.Millisecond

// level is a priority level marker; name "" stands for every level.
type level struct {
	name string
	rev  int64
}

// firstRead is the head of one shard, read with the level markers.
type firstRead struct {
	start int
	kvs   []*mvccpb.KeyValue
	rev   int64
	// bounded: the open segments' list was read within the window, so
	// segments submitted after its end were not seen.
	bounded bool
}

// readLevels returns queue's priority level markers, highest priority first,
// and whether the queue is FIFO; in the same read it takes the head of the
// next shard, which a claim of a queue with one level uses as its first
// read, so that the markers cost no round trip of their own.
func (w *claimer) readLevels(ctx context.Context, n int, hot string, listOpen bool) ([]level, bool, *firstRead, []*mvccpb.KeyValue, *segState, error) {
	start := int(w.shardCursor.Add(1))
	ops := []clientv3.Op{
		clientv3.OpGet(w.keys.QueueLevels(w.queue), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(w.keys.QueueConfig(w.queue)),
		clientv3.OpGet(w.client.shardPrefix(w.queue, start%Shards), clientv3.WithPrefix(), clientv3.WithLimit(int64(2*n+8))),
	}
	pre := w.keys.SegmentsOpen(w.queue)
	w.levelMu.Lock()
	above, from, end, bounded := w.window.bounds(pre)
	gen := w.windowGen
	w.levelMu.Unlock()
	if !bounded {
		above, from, end = pre, pre, clientv3.GetPrefixRangeEnd(pre)
	}
	if listOpen {
		ops = append(ops, openRange(from, end))
	} else {
		ops = append(ops, clientv3.OpGet(w.keys.SegmentOpen(w.queue, hot), clientv3.WithKeysOnly()))
	}
	ops = append(ops, openRange(pre, above))
	// The segment this claim loop takes from (the one it took from last,
	// or the next open one), read in the same request, with its tasks
	// when they are not at hand yet.
	hotCached := false
	if hot != "" {
		_, hotCached = w.client.segCache.get(w.queue + "/" + hot)
		ops = append(ops, w.client.stateOps(w.queue, hot)...)
		if !hotCached {
			ops = append(ops, clientv3.OpGet(w.keys.Segment(w.queue, hot)))
		}
	}
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, false, nil, nil, nil, fmt.Errorf("queue: read the priority levels of %s: %w", w.queue, err)
	}
	var hotState *segState
	if hot != "" {
		hotState = w.client.parseState(w.queue, hot, resp.Header.Revision, resp.Responses[5:])
		if kvs := resp.Responses[len(resp.Responses)-1].GetResponseRange().Kvs; !hotCached && len(kvs) == 1 {
			if _, err := w.client.cacheSegment(w.queue, hot, kvs[0].Value); err != nil {
				hotState = nil // undecodable: claimSegment reads it again and quarantines it
			}
		}
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	out := make([]level, 0, len(kvs))
	for _, kv := range kvs {
		name, _ := keyspace.Last(w.keys.QueueLevels(w.queue), string(kv.Key))
		out = append(out, level{name: name, rev: kv.ModRevision})
	}
	var cfg Config
	if c := resp.Responses[1].GetResponseRange().Kvs; len(c) == 1 {
		_ = json.Unmarshal(c[0].Value, &cfg)
	}
	// Segments of a higher level than the window's first, then the window.
	open := append(resp.Responses[4].GetResponseRange().Kvs, resp.Responses[3].GetResponseRange().Kvs...)
	if listOpen {
		if open, bounded, err = w.sawOpen(ctx, pre, resp.Header.Revision, gen, bounded, !bounded || end == clientv3.GetPrefixRangeEnd(pre), open); err != nil {
			return nil, false, nil, nil, nil, err
		}
	}
	return out, cfg.FIFO, &firstRead{start: start, kvs: resp.Responses[2].GetResponseRange().Kvs, rev: resp.Header.Revision, bounded: listOpen && bounded}, open, hotState, nil
}

// sawOpen adapts the window to the open segments a read found, and reads
// them again, as the window then says (from its head to the last open
// segment, or without a bound), when the read found none; it returns the
// segments and whether their read stopped before the last open segment
// (bounded). rev is the revision of the read, gen the window's windowGen
// when its bounds were taken.
func (w *claimer) sawOpen(ctx context.Context, pre string, rev, gen int64, bounded, toEnd bool, open []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, bool, error) {
	toLast := toEnd // the last read ran to the last open segment
	for {
		names := make([]string, 0, len(open))
		for _, kv := range open {
			name, _ := keyspace.Last(pre, string(kv.Key))
			names = append(names, name)
		}
		w.levelMu.Lock()
		if rev < w.windowAt || bounded && gen != w.windowGen {
			// The other claim loop's read, or a segment's event, came
			// after this read: its older view must not move the window
			// (its head past a segment it did not see yet); nor may a
			// read bounded by the window as it was before an event or
			// a missed wait made it unknown.
			w.levelMu.Unlock()
			return open, bounded && !toLast, nil
		}
		w.windowAt = rev
		if !bounded && w.noted == 0 {
			// No segment opened up to rev lies before the window's
			// head now: the claimer's waits go on from here (claimWait).
			w.noted = rev
		}
		enough := w.window.sawTo(names, openRead, bounded, toEnd)
		var above, from, end string
		var ok bool
		if !enough {
			above, from, end, ok = w.window.bounds(pre)
			gen = w.windowGen
		}
		w.levelMu.Unlock()
		if enough {
			return open, bounded && !toLast, nil
		}
		if !ok {
			g, err := w.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
			if err != nil {
				return nil, false, fmt.Errorf("queue: read open segments of %s: %w", w.queue, err)
			}
			open, bounded, toLast, toEnd, rev = g.Kvs, false, true, true, g.Header.Revision
			continue
		}
		// To the last open segment (or a step of it, see toLast):
		// bounded only below its head.
		resp, err := w.cli.Txn(ctx).Then(openRange(pre, above), openRange(from, end)).Commit()
		if err != nil {
			return nil, false, fmt.Errorf("queue: read open segments of %s: %w", w.queue, err)
		}
		toEnd, rev = end == clientv3.GetPrefixRangeEnd(pre), resp.Header.Revision
		open, bounded, toLast = append(resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs...), true, toEnd
	}
}

// openRange is the read of the open segments' keys in [from, end), a page
// of openRead at most.
func openRange(from, end string) clientv3.Op {
	return clientv3.OpGet(from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
}

// pickLevel chooses the priority level the next read takes tasks from; false
// when every choice was tried. The rule: seven claims in eight read the
// highest level with tasks that are not all running; every eighth reads the
// levels below it in turn, so no level starves; every 64th, or whenever the
// queue has one level or none, reads every level at once (shard order, which
// also finds tasks whose level has no marker).
func (w *claimer) pickLevel(levels []level, seq int64, tried map[string]bool) (level, bool) {
	if len(levels) <= 1 || seq%64 == 0 {
		return level{}, !tried[""]
	}
	now := time.Now()
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	var open []level
	for _, lv := range levels {
		if !tried[lv.name] && now.After(w.busyLevels[lv.name]) {
			open = append(open, lv)
		}
	}
	if len(open) == 0 {
		return level{}, !tried[""]
	}
	return open[lowerTurn(len(open), seq)], true
}

// lowerTurn is the anti-starvation rule among open levels, highest first,
// for the claim with sequence number seq (not negative): it reads the top
// one (index 0) seven times in eight, and on every eighth claim the levels
// below it in turn, so that each of them is read within 8*(open-1) claims.
// levelTurns keeps the same rule for segments, whose levels are numbers.
func lowerTurn(open int, seq int64) int {
	if seq%8 != 0 || open < 2 {
		return 0
	}
	return 1 + int((seq/8)%int64(open-1))
}

// readPending reads up to about 2n pending keys of priority level lv (""
// every level): one shard first, then the following shards several at a
// time, starting from a different shard each call (shard 0 in a FIFO queue).
// covered says every shard was read.
func (w *claimer) readPending(ctx context.Context, n int, lv string, fifo bool, pre *firstRead) (cands, suspects []*mvccpb.KeyValue, rev int64, covered bool, err error) {
	q := w.queue
	perRead := 8
	if lv != "" {
		perRead = 32 // a level may be sparse: read wide
	}
	classify := func(kvs []*mvccpb.KeyValue) {
		for _, kv := range kvs {
			var pv pendingValue
			if json.Unmarshal(kv.Value, &pv) == nil && pv.Claimed {
				suspects = append(suspects, kv)
			} else {
				cands = append(cands, kv)
			}
		}
	}
	var start, read int
	switch {
	case fifo:
		start = 0 // a FIFO queue's tasks are in shard 0: read it first, in order
	case lv == "" && pre != nil: // the first shard came with the level markers
		start, read, rev = pre.start, 1, pre.rev
		classify(pre.kvs)
	default:
		start = int(w.shardCursor.Add(1))
	}
	next := start + read
	for ; next < start+Shards && len(cands) < n; read++ {
		width, limit := 1, int64(2*n+8)
		if read > 0 || lv != "" && !fifo {
			width, limit = perRead, int64(2*n/perRead+4)
		}
		ops := make([]clientv3.Op, 0, width)
		for j := 0; j < width && next < start+Shards; j++ {
			ops = append(ops, clientv3.OpGet(w.client.shardPrefix(q, next%Shards)+lv, clientv3.WithPrefix(), clientv3.WithLimit(limit)))
			next++
		}
		resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, nil, 0, false, err
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, r := range resp.Responses {
			classify(r.GetResponseRange().Kvs)
		}
	}
	return cands, suspects, rev, next >= start+Shards, nil
}

// orphans returns the claimed pending keys among suspects (at most 100)
// whose claim key is gone: their worker died, and they are claimable again.
func (w *claimer) orphans(ctx context.Context, suspects []*mvccpb.KeyValue) ([]*mvccpb.KeyValue, error) {
	q, pre := w.queue, w.keys.QueuePending(w.queue)
	suspects = suspects[:min(len(suspects), 100)]
	ops := make([]clientv3.Op, len(suspects))
	for i, kv := range suspects {
		ops[i] = clientv3.OpGet(w.keys.QueueClaim(q, pendingID(string(kv.Key), pre)), clientv3.WithCountOnly())
	}
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	var out []*mvccpb.KeyValue
	for i, r := range resp.Responses {
		if r.GetResponseRange().Count == 0 {
			out = append(out, suspects[i])
		}
	}
	return out, nil
}
