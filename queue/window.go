package queue

import (
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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
}

// widen makes the next read run from the window's head to the last open
// segment: a read within the window found nothing to claim (a long task
// keeps the oldest segment open), and segments submitted after the
// window's end may be waiting. The read after it is bounded again.
func (ow *openWindow) widen() { ow.tail = true }

const (
	minOpenWidth = 10 * time.Millisecond
	maxOpenWidth = time.Hour
)

// bounds returns the ranges the read of the open segments under prefix
// takes: the levels above the window's (new segments of a higher
// priority), then the window from its head on. Deleted keys stay in etcd's
// index until compaction and count in a range too, so the window starts at
// its head, after the closed segments. ok false: no bound (the window is
// not known yet).
func (ow *openWindow) bounds(prefix string) (above, from, end string, ok bool) {
	if !ow.known {
		return "", "", "", false
	}
	end = keyspace.SegmentBound(prefix, ow.level, ow.head.Add(ow.width))
	if ow.tail {
		end = clientv3.GetPrefixRangeEnd(prefix)
	}
	return prefix + keyspace.LevelName(ow.level), keyspace.SegmentBound(prefix, ow.level, ow.head), end, true
}

// saw adapts the window to the names a read returned (in order), limit
// being its page size; bounded says whether the read had an end. It
// returns false when a bounded read found nothing: the window has fallen
// behind (or the queue is empty), and the caller reads once without a
// bound.
func (ow *openWindow) saw(names []string, limit int, bounded bool) bool {
	ow.tail = false
	if len(names) == 0 {
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
	ow.level, ow.head, ow.known = lv, at, true
	return true
}
