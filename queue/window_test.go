package queue

import (
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
)

// TestOpenWindow: the bound on the read of open segments follows the oldest
// segment, widens when reads find few, narrows when a page is full, and
// asks for a read to the last open segment when a bounded one found
// nothing.
func TestOpenWindow(t *testing.T) {
	var ow openWindow
	pre := "/ns/queues/q/open/"
	if _, _, _, ok := ow.bounds(pre); ok {
		t.Fatal("an unknown window must not bound the read")
	}
	t0 := time.Unix(1_800_000_000, 0)
	seg := func(level int, at time.Time) string { return keyspace.SegmentName(level, at, "abcdef12") }
	if !ow.saw([]string{seg(1000, t0), seg(1000, t0.Add(time.Millisecond))}, 32, false) {
		t.Fatal("an unbounded read that found segments needs no other")
	}
	above, from, end, _ := ow.bounds(pre)
	if !strings.HasPrefix(end, pre+"1000-") || end <= pre+seg(1000, t0) || end >= pre+seg(1000, t0.Add(3*time.Second)) {
		t.Fatalf("end %q: want just after the oldest segment, within 3 s", end)
	}
	if from > pre+seg(1000, t0) || from <= pre+seg(1000, t0.Add(-time.Millisecond)) {
		t.Fatalf("from %q: want the oldest segment's place", from)
	}
	if above != pre+"1000" {
		t.Fatalf("above %q: want the levels before 1000", above)
	}
	// Few found: the window widens; a full page: it narrows.
	w0 := ow.width
	ow.saw([]string{seg(1000, t0)}, 32, true)
	if ow.width != 2*w0 {
		t.Fatalf("width %s after a sparse read, want %s", ow.width, 2*w0)
	}
	full := make([]string, 32)
	for i := range full {
		full[i] = seg(1000, t0.Add(time.Duration(i)*time.Millisecond))
	}
	ow.saw(full, 32, true)
	if ow.width != w0 {
		t.Fatalf("width %s after a full page, want %s", ow.width, w0)
	}
	// A higher-priority segment submitted later is in the range above.
	if above, _, _, _ := ow.bounds(pre); pre+seg(0, t0.Add(time.Hour)) >= above {
		t.Fatalf("a segment of a higher level falls outside the range above, ending %q", above)
	}
	// A bounded read that found nothing: read again to the last open
	// segment (TestOpenWindowEmptyQueue has what follows).
	if ow.saw(nil, 32, true) {
		t.Fatal("an empty bounded read must ask for another")
	}
	if _, _, end, ok := ow.bounds(pre); !ok || end != pre[:len(pre)-1]+"0" {
		t.Fatalf("after an empty read: bounded %t, end %q: want a read to the last open segment", ok, end)
	}
}

// TestOpenWindowEmptyQueue: a window that found nothing is read again to
// the last open segment before a read without a bound; a queue found empty
// by a read without a bound is read from then (less the clock slack) to
// its last open segment, and without a bound again only when such a read
// finds nothing emptyRecheck after the last, or fullEvery after the last
// whatever it finds; a queue whose level is not known yet is read without
// a bound as before.
func TestOpenWindowEmptyQueue(t *testing.T) {
	pre := "/ns/queues/q/open/"
	var fresh openWindow
	if fresh.saw(nil, 32, true) || !fresh.saw(nil, 32, false) {
		t.Fatal("a window that never saw a segment: an empty bounded read asks for an unbounded one, which ends it")
	}
	if _, _, _, ok := fresh.bounds(pre); ok {
		t.Fatal("a window that never saw a segment must not bound the read")
	}

	var ow openWindow
	seg := func(level int, at time.Time) string { return keyspace.SegmentName(level, at, "abcdef12") }
	toLast := func(what string) {
		t.Helper()
		if _, _, end, ok := ow.bounds(pre); !ok || end != pre[:len(pre)-1]+"0" {
			t.Fatalf("%s: bounded %t, end %q: want a read to the last open segment", what, ok, end)
		}
	}
	ow.saw([]string{seg(1000, time.Now().Add(-time.Hour))}, 32, false)
	if ow.saw(nil, 32, true) {
		t.Fatal("an empty window must ask for another read")
	}
	// Its head an hour ago: the read to the last goes in steps
	// (TestOpenWindowSteps), each empty one asking for the next.
	for step := 0; ; step++ {
		_, _, end, ok := ow.bounds(pre)
		if !ok || step > 10 {
			t.Fatalf("step %d of the read to the last: bounded %t, end %q", step, ok, end)
		}
		if end == pre[:len(pre)-1]+"0" {
			break
		}
		if ow.sawTo(nil, 32, true, false) {
			t.Fatalf("an empty step %d of the read to the last must ask for the next", step)
		}
	}
	toLast("after an empty window")
	if !ow.saw(nil, 32, true) {
		t.Fatal("an empty read to the last, right after a read without a bound, needs no other")
	}
	toLast("while empty")
	ow.fullAt = time.Now().Add(-emptyRecheck - time.Millisecond)
	if ow.saw(nil, 32, true) {
		t.Fatal("an empty read to the last, emptyRecheck after the last read without a bound, must ask for one")
	}
	if _, _, _, ok := ow.bounds(pre); ok {
		t.Fatal("the read asked for must have no bound")
	}
	if !ow.saw(nil, 32, false) {
		t.Fatal("an empty read without a bound needs no other")
	}
	toLast("after an empty read without a bound")
	now := time.Now()
	above, from, _, _ := ow.bounds(pre)
	if above != pre+"1000" {
		t.Fatalf("above %q: want the levels before 1000", above)
	}
	if from < keyspace.SegmentBound(pre, 1000, now.Add(-clockSlack-time.Second)) || from > keyspace.SegmentBound(pre, 1000, now.Add(-clockSlack+time.Second)) {
		t.Fatalf("from %q: want about %s before now", from, clockSlack)
	}
	if s := pre + seg(1000, time.Now()); s < from {
		t.Fatalf("a segment submitted now, %q, is before the read's start %q", s, from)
	}
	// A queue never found empty is read without a bound every fullEvery.
	ow.saw([]string{seg(1000, time.Now())}, 32, true)
	if _, _, _, ok := ow.bounds(pre); !ok {
		t.Fatal("a window that found segments must bound the next read")
	}
	ow.fullAt = time.Now().Add(-fullEvery)
	if _, _, _, ok := ow.bounds(pre); ok {
		t.Fatal("fullEvery after the last read without a bound, the next must have none")
	}
	if _, _, _, ok := ow.bounds(pre); !ok {
		t.Fatal("a read without a bound given to one claim loop must leave the others' reads bounded")
	}
}

// TestOpenWindowCreated: a segment opened at the window's level before its
// head makes the next read unbounded; one after the head, or of a higher
// level (the range above), leaves the window as it is.
func TestOpenWindowCreated(t *testing.T) {
	pre := "/ns/queues/q/open/"
	seg := func(level int, at time.Time) string { return keyspace.SegmentName(level, at, "abcdef12") }
	t0 := time.Now()
	var ow openWindow
	ow.saw([]string{seg(1000, t0)}, 32, false)
	ow.created(seg(1000, t0.Add(time.Second)))
	ow.created(seg(900, t0.Add(-time.Hour)))
	if _, _, _, ok := ow.bounds(pre); !ok {
		t.Fatal("a segment after the head, or of a higher level, must leave the window bounded")
	}
	ow.created(seg(1000, t0.Add(-time.Second)))
	if _, _, _, ok := ow.bounds(pre); ok {
		t.Fatal("a segment of the window's level before its head must make the next read unbounded")
	}
}

// TestOpenWindowSteps: a read to the last open segment from a head long
// past (claims fell behind a backlog of segments moved from the due index)
// goes in steps that reach tailGrowth times as far each, the first
// tailFirst widths after the head, the last to the last open segment; a
// step that found segments ends it; a queue found empty by a read without
// a bound is read to the last at once.
func TestOpenWindowSteps(t *testing.T) {
	pre := "/ns/queues/q/open/"
	seg := func(level int, at time.Time) string { return keyspace.SegmentName(level, at, "abcdef12") }
	head := time.Now().Add(-time.Minute)
	var ow openWindow
	full := make([]string, 32)
	for i := range full {
		full[i] = seg(1000, head.Add(time.Duration(i)*time.Microsecond))
	}
	ow.saw(full, 32, false)
	for range 10 {
		ow.saw(full, 32, true) // full pages: the narrowest window
	}
	if ow.width != minOpenWidth {
		t.Fatalf("width %s after full pages, want %s", ow.width, minOpenWidth)
	}
	if ow.saw(nil, 32, true) {
		t.Fatal("an empty window must ask for another read")
	}
	reach := tailFirst * minOpenWidth
	for step := 0; ; step++ {
		_, from, end, ok := ow.bounds(pre)
		if !ok || from != keyspace.SegmentBound(pre, 1000, head) {
			t.Fatalf("step %d: bounded %t, from %q: want the head's place", step, ok, from)
		}
		if reach >= time.Minute {
			if end != pre[:len(pre)-1]+"0" {
				t.Fatalf("step %d: end %q, want the last open segment", step, end)
			}
			break
		}
		if want := keyspace.SegmentBound(pre, 1000, head.Add(reach)); end != want {
			t.Fatalf("step %d: end %q, want %q", step, end, want)
		}
		if ow.sawTo(nil, 32, true, false) {
			t.Fatalf("an empty step %d must ask for the next", step)
		}
		reach *= tailGrowth
	}
	// A step that found segments ends the read to the last.
	ow.widen()
	if !ow.sawTo([]string{seg(1000, head.Add(time.Second))}, 32, true, false) {
		t.Fatal("a step that found segments needs no other")
	}
	if _, _, end, _ := ow.bounds(pre); end != keyspace.SegmentBound(pre, 1000, head.Add(time.Second).Add(ow.width)) {
		t.Fatalf("after a step that found segments: end %q, want the window after them", end)
	}
	// Found empty by a read without a bound: to the last at once.
	var empty openWindow
	empty.saw([]string{seg(1000, head)}, 32, false)
	empty.saw(nil, 32, false)
	if _, _, end, ok := empty.bounds(pre); !ok || end != pre[:len(pre)-1]+"0" {
		t.Fatalf("a queue found empty: bounded %t, end %q, want a read to the last", ok, end)
	}
}
