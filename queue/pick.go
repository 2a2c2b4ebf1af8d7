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

// pickSegments returns up to severalMax segments to claim from, in the order to
// try them. The rule, as for
// tasks with records of their own: seven claims in eight take the highest
// priority level's oldest segments; every eighth takes the next level below
// it in turn, so no level starves. Among the first segments of the level it
// picks at random (in a FIFO queue: the oldest), so that workers do not all
// race for one segment.
func (w *claimer) pickSegments(ctx context.Context, open []*mvccpb.KeyValue, fifo, bounded bool, seq int64) ([]string, error) {
	q := w.queue
	pre := w.keys.SegmentsOpen(q)
	names := w.notBusy(pre, open)
	if len(names) == 0 && len(open) > 0 && (bounded || len(open) == openRead) {
		// The first page, or all the window holds, is busy: read on.
		var err error
		if names, err = w.readOn(ctx, pre, open[len(open)-1]); err != nil {
			return nil, err
		}
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
	// Each claim starts at a random one of the first segments and takes
	// on from there (claimSeveral), wrapping round: the claim loops of
	// every worker then take from different segments, where starting at
	// the first few made them race for the same ones, and a run whose
	// segment another loop claimed from since its read is refused whole.
	names = names[:min(len(names), severalMax)]
	k := rand.IntN(len(names))
	return append(slices.Clone(names[k:]), names[:k]...), nil
}

// readOn returns the open segments after last (a key of the list read)
// that are not busy, reading in steps: the first ends readOnFirst after
// last's name, each that found none reaches readOnGrowth times as far, and
// the step that would reach within clockSlack of now reads to the last
// open segment. A segment moved from the due index is named after its due
// time, so the open segments of a queue whose claims fell behind lie after
// the busy ones by the thousand, and a range to the last counts them all
// (etcd counts every key of a range, whatever its limit).
func (w *claimer) readOn(ctx context.Context, pre string, last *mvccpb.KeyValue) ([]string, error) {
	from := string(last.Key) + "\x00"
	name, _ := keyspace.Last(pre, string(last.Key))
	lv, at, named := keyspace.ParseSegmentName(name)
	for span := readOnFirst; ; span *= readOnGrowth {
		end := clientv3.GetPrefixRangeEnd(pre)
		reach := at.Add(span)
		step := named && reach.Before(time.Now().Add(-clockSlack))
		if step {
			end = keyspace.SegmentBound(pre, lv, reach)
		}
		if from >= end {
			continue
		}
		g, err := w.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(4*openRead))
		if err != nil {
			return nil, fmt.Errorf("queue: read open segments of %s: %w", w.queue, err)
		}
		if names := w.notBusy(pre, g.Kvs); len(names) > 0 || !step {
			return names, nil
		}
		from = end
		if g.More {
			from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
		}
	}
}

const (
	// readOnFirst and readOnGrowth: see readOn.
	readOnFirst  = 50 * time.Millisecond
	readOnGrowth = 8
)

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

// levelTurns applies the anti-starvation rule to the priority levels of a
// queue's open segments: seven claims in eight (by sequence number) read the
// highest level; every eighth reads the levels below it, starting after the
// level the last such turn took, so that the levels below take turns. The
// zero value is ready; it is not safe for concurrent use.
type levelTurns struct {
	last int // the level the last lower turn took
}

// openWindow bounds the read of a queue's open segments. etcd counts every
// key of a range it reads, even with a limit, so reading the first 32 of
// 10,000 open segments costs the 10,000. Segment names sort by level, then
// submission time, so a range that ends a little after the oldest open
// segment of the top level holds the first few segments and counts only
// them. The window's width adapts: it doubles when a read found few
// segments and halves when it found a full page. Not safe for concurrent
// use.
type openWindow struct {
	level int           // the top level at the last read
	head  time.Time     // the oldest open segment's submission time at the last read
	width time.Duration // how far after head the range ends
	known bool
	// tail: the next read runs from head to the last open segment (see
	// widen).
	tail bool
	// leveled: a read has found an open segment, so level is one the
	// queue uses. fullAt: when the open segments were last read without a
	// bound.
	leveled bool
	fullAt  time.Time
	// span: how far after head a read to the last reaches (see bounds);
	// 0: to the last.
	span time.Duration
	// emptyHead: head is where a read without a bound found the queue
	// empty (less clockSlack), not a segment: its reads to the last run
	// to the last at once.
	emptyHead bool
}

// widen makes the next read run from the window's head to the last open
// segment: a read within the window found nothing to claim (a long task
// keeps the oldest segment open), and segments submitted after the
// window's end may be waiting. The read after it is bounded again.
func (ow *openWindow) widen() { ow.toLast() }

// toLast makes the next read run from the window's head on to the last
// open segment, in steps: a segment moved from the due index is named
// after its due time, so a queue whose claims fell behind holds its
// backlog after the head, and a range to the last counts all of it (etcd
// counts every key of a range, whatever its limit). The first step ends
// tailFirst window widths after the head, and each that finds nothing
// reaches tailGrowth times as far (see bounds and saw).
func (ow *openWindow) toLast() {
	ow.tail, ow.span = true, 0
	if !ow.emptyHead {
		ow.span = max(tailFirst*ow.width, minOpenWidth)
	}
}

const (
	minOpenWidth = 10 * time.Millisecond
	maxOpenWidth = time.Hour
	// emptyRecheck is how often, at most, the open segments of a queue
	// found empty are read without a bound; between two such reads they
	// are read from clockSlack before the last one on. A closed segment's
	// key stays in etcd's index until compaction (an hour of history by
	// default) and a read counts it: read without a bound whenever its
	// window came back empty, as it did, an often empty queue that gets
	// 200 one-task submissions a second counted up to 720,000 of them at
	// nearly every claim.
	emptyRecheck = time.Second
	// fullEvery is how often, at most, a queue that is never found empty
	// has its open segments read without a bound all the same: a segment
	// whose name sorts before the window's head (a submitter's clock
	// behind this one's) is seen within it.
	fullEvery = 10 * time.Second
	// clockSlack is how far before the moment a read without a bound
	// found the queue empty the window starts: a segment named earlier (a
	// submitter's clock behind this one's, a submission held up) is read
	// without a bound when its watch event comes (openWindow.created).
	clockSlack = time.Second
	// tailFirst and tailGrowth: a read to the last open segment first
	// reaches tailFirst window widths after the head, and each of its
	// steps that found nothing tailGrowth times as far; the step that
	// would reach within clockSlack of now reads to the last.
	tailFirst  = 4
	tailGrowth = 8
)

// bounds returns the ranges the read of the open segments under prefix
// takes: the levels above the window's (new segments of a higher
// priority), then the window from its head on. Deleted keys stay in etcd's
// index until compaction and count in a range too, so the window starts at
// its head, after the closed segments. ok false: no bound (the window is
// not known yet, or fullEvery has passed: then the time is noted, so that
// one claim loop sharing the window reads without a bound, not all).
func (ow *openWindow) bounds(prefix string) (above, from, end string, ok bool) {
	if !ow.known {
		return "", "", "", false
	}
	now := time.Now()
	if now.Sub(ow.fullAt) >= fullEvery {
		ow.fullAt = now // this read has no bound: the other claim loops' keep theirs
		return "", "", "", false
	}
	end = keyspace.SegmentBound(prefix, ow.level, ow.head.Add(ow.width))
	if ow.tail {
		end = clientv3.GetPrefixRangeEnd(prefix)
		if reach := ow.head.Add(ow.span); ow.span > 0 && reach.Before(now.Add(-clockSlack)) {
			end = keyspace.SegmentBound(prefix, ow.level, reach)
		}
	}
	return prefix + keyspace.LevelName(ow.level), keyspace.SegmentBound(prefix, ow.level, ow.head), end, true
}

// saw adapts the window to the names a read returned (in order), limit
// being its page size; bounded says whether the read had a bound. It
// returns false when the read found nothing and another is due: the
// caller reads again with the window's bounds. A window that ends before
// the last open segment and found nothing is read again to the last (the
// window fell behind, or the queue is empty); a read to the last that
// found nothing is read again without a bound unless one was made within
// emptyRecheck; and a queue that a read without a bound found empty is
// read from then (less clockSlack) to its last open segment.
func (ow *openWindow) saw(names []string, limit int, bounded bool) bool {
	return ow.sawTo(names, limit, bounded, true)
}

// sawTo is saw for a read that ran to the last open segment or not
// (toEnd false: a step of a read to the last that ended before it, see
// toLast): such a step that found nothing asks for the next, which
// reaches tailGrowth times as far.
func (ow *openWindow) sawTo(names []string, limit int, bounded, toEnd bool) bool {
	wasTail := ow.tail
	ow.tail = false
	now := time.Now()
	if !bounded {
		ow.fullAt = now
	}
	if len(names) == 0 {
		switch {
		case !bounded && ow.leveled: // nothing open anywhere
			ow.known, ow.emptyHead = true, true
			ow.head = now.Add(-clockSlack)
			ow.toLast()
			return true
		case bounded && wasTail && !toEnd && ow.known: // a step of the read to the last: on
			ow.tail = true
			ow.span *= tailGrowth
			return false
		case bounded && !wasTail && ow.known: // the window fell behind, or the queue is empty
			ow.toLast()
			return false
		case bounded && wasTail && ow.known && now.Sub(ow.fullAt) < emptyRecheck:
			ow.tail, ow.span = true, 0 // nothing open from the head to the last: still empty
			return true
		}
		ow.known = false
		return !bounded
	}
	lv, at, ok := keyspace.ParseSegmentName(names[0])
	if !ok {
		ow.known = false
		return true
	}
	if !ow.known || ow.width == 0 {
		ow.width = time.Second
	}
	switch {
	case len(names) >= limit:
		ow.width = max(ow.width/2, minOpenWidth)
	case len(names) < limit/4:
		ow.width = min(ow.width*2, maxOpenWidth)
	}
	ow.level, ow.head, ow.known, ow.leveled, ow.emptyHead = lv, at, true, true, false
	return true
}

// created notes that segment name was opened (a watch event): a segment
// of the window's level named before its head (its submitter's clock
// behind this one's, or its submission held up past a read that found the
// queue empty) lies outside every read the window bounds, so the next
// read has no bound. Without it the claim that event woke would find
// nothing and wait, its wake-up spent.
func (ow *openWindow) created(name string) {
	if !ow.known {
		return
	}
	lv, at, ok := keyspace.ParseSegmentName(name)
	if !ok || (lv == ow.level && at.Before(ow.head)) {
		ow.known = false
	}
}
