package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Which open segments a claim tries, and in what order: the priority
// rule's turns, segments marked busy (all their slots taken) skipped for a
// moment, and the segments other claim loops of the worker take from left
// to them.

// isBusy reports whether seg is marked busy.
func (w *claimer) isBusy(seg string) bool {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	until, ok := w.busySegs[seg]
	return ok && time.Now().Before(until)
}

// pickSegments returns up to eight segments to claim from, in the order to
// try them. The rule, as for
// tasks with records of their own: seven claims in eight take the highest
// priority level's oldest segments; every eighth takes the next level below
// it in turn, so no level starves. Among the first segments of the level it
// picks at random (in a FIFO queue: the oldest), so that workers do not all
// race for one segment.
func (w *claimer) pickSegments(ctx context.Context, open []*mvccpb.KeyValue, fifo bool, seq int64) ([]string, error) {
	q := w.queue
	pre := w.keys.SegmentsOpen(q)
	names := w.notBusy(pre, open)
	if len(names) == 0 && len(open) == openRead {
		// The first page is all busy: read on.
		g, err := w.cli.Get(ctx, string(open[len(open)-1].Key)+"\x00", clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(4*openRead))
		if err != nil {
			return nil, fmt.Errorf("queue: read open segments of %s: %w", q, err)
		}
		names = w.notBusy(pre, g.Kvs)
	}
	if len(names) == 0 {
		return nil, nil
	}
	top, _ := keyspace.SegmentLevel(names[0])
	w.levelMu.Lock()
	from, lower := w.turns.from(seq, top)
	w.levelMu.Unlock()
	for try := 0; lower && !fifo && try < 2; try++ {
		g, err := w.cli.Get(ctx, pre+keyspace.LevelName(from), clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
		if err != nil {
			return nil, fmt.Errorf("queue: read open segments of %s: %w", q, err)
		}
		low := w.notBusy(pre, g.Kvs)
		lv := 0
		if len(low) > 0 {
			lv, _ = keyspace.SegmentLevel(low[0])
			names = low
		}
		w.levelMu.Lock()
		w.turns.took(lv, len(low) > 0, top)
		w.levelMu.Unlock()
		if len(low) > 0 || from == top+1 {
			break
		}
		from = top + 1 // past the lowest level: start again below the top
	}
	lv, _ := keyspace.SegmentLevel(names[0])
	same := 0
	for same < len(names) {
		if l, _ := keyspace.SegmentLevel(names[same]); l != lv {
			break
		}
		same++
	}
	names = names[:same]
	if fifo {
		return names[:1], nil
	}
	if w.spread > 0 {
		// Many external claims at once, each of its own Worker: each
		// starts at another of the level's segments, in turn, rather than
		// all racing for the first few.
		k := int(w.spread % uint64(len(names)))
		names = append(slices.Clone(names[k:]), names[:k]...)
		return names[:min(len(names), max(w.pickN, 8))], nil
	}
	window := names[:min(len(names), 4)]
	rand.Shuffle(len(window), func(i, j int) { window[i], window[j] = window[j], window[i] })
	return names[:min(len(names), 8)], nil
}

// from returns the level a claim with sequence number seq reads from, given
// the highest level with open segments, top, and whether it is a lower
// level's turn.
func (lt *levelTurns) from(seq int64, top int) (level int, lower bool) {
	if seq%8 != 0 {
		return top, false
	}
	return max(top, lt.last) + 1, true
}

// took records what a lower turn found: the level it took, or none (found
// false: no level below the last one has open segments), which starts the
// turns again below the top; the caller then reads once more from top+1.
func (lt *levelTurns) took(level int, found bool, top int) {
	if found {
		lt.last = level
	} else {
		lt.last = top
	}
}

// notBusy returns the names of the open segments kvs that are not known to
// have all their slots running.
func (w *claimer) notBusy(pre string, kvs []*mvccpb.KeyValue) []string {
	now := time.Now()
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	var out []string
	for _, kv := range kvs {
		name, ok := keyspace.Last(pre, string(kv.Key))
		if !ok {
			continue
		}
		if until, busy := w.busySegs[name]; busy && now.Before(until) {
			continue
		}
		out = append(out, name)
	}
	for k, until := range w.busySegs {
		if now.After(until) {
			delete(w.busySegs, k)
		}
	}
	return out
}

// markBusy skips segment seg for a while (all its slots run, or it is done).
func (w *claimer) markBusy(seg string) {
	w.levelMu.Lock()
	w.busySegs[seg] = time.Now().Add(segBusyFor)
	w.levelMu.Unlock()
}

// forgetBusy forgets every segment marked busy: an external claim that
// waited in line did not see the runs that ended meanwhile (the line's
// leader did).
func (w *claimer) forgetBusy() {
	w.levelMu.Lock()
	clear(w.busySegs)
	w.levelMu.Unlock()
}

// unmarkBusy forgets that seg was marked busy: a run of it ended.
func (w *claimer) unmarkBusy(seg string) {
	w.levelMu.Lock()
	delete(w.busySegs, seg)
	w.levelMu.Unlock()
}

// notOthersHot returns cands without the segments the worker's other claim
// loops are taking from (two loops on one segment spoil each other's
// claims), unless that leaves none.
func (w *claimer) notOthersHot(lane int, cands []string) []string {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	var out []string
	for _, seg := range cands {
		taken := false
		for l, h := range w.hot {
			taken = taken || l != lane && h == seg
		}
		if !taken {
			out = append(out, seg)
		}
	}
	if len(out) == 0 {
		return cands
	}
	return out
}
