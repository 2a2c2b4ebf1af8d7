package queue

import (
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
)

// TestOpenWindow: the bound on the read of open segments follows the oldest
// segment, widens when reads find few, narrows when a page is full, and
// asks for an unbounded read when a bounded one found nothing.
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
	// A bounded read that found nothing: read again without a bound.
	if ow.saw(nil, 32, true) {
		t.Fatal("an empty bounded read must ask for an unbounded one")
	}
	if _, _, _, ok := ow.bounds(pre); ok {
		t.Fatal("after an empty read the window must be unknown")
	}
}
