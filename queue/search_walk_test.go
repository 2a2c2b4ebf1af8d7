package queue_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/cursor"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestSearchForgedCursor: a cursor is base64 JSON with a digest of public
// parts, so anyone can make one; one whose place the walk cannot be at (a
// status index -1 or past the last, a slot past a segment's, a phase of
// another kind of walk) is refused as bad input naming the cursor, not
// followed into a panic.
func TestSearchForgedCursor(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	if _, err := c.Submit(ctx, "fq", tasks(3, "x"), nil); err != nil {
		t.Fatal(err)
	}
	digest := cursor.Digest("fq", "", "", "", "", "")
	for _, cur := range []cursor.Cursor{
		{Digest: digest, Phase: "r", Index: -1}, {Digest: digest, Phase: "r", Index: 9},
		{Digest: digest, Phase: "s", Slot: 101}, {Digest: digest, Phase: "s", Slot: -7},
		{Digest: digest, Phase: "i", Key: "t-"}, {Digest: digest, Phase: "q"},
	} {
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("cursor %+v panics: %v", cur, r)
				}
			}()
			_, err := c.Search(ctx, "fq", queue.SearchQuery{Cursor: cursor.Encode(cur)})
			if !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "cursor") {
				t.Errorf("cursor %+v: %v, want bad input naming the cursor", cur, err)
			}
		}()
	}
}

// TestSearchFindsTaskMovedMidWalk: a task moves one way only, from its
// segment to a record of its own (cancelled, retried, dead), so a walk of
// the segments first and the records after lists a task that moves while
// the pages go on at least once. Here t-00150 is cancelled after the first
// page, before the walk reaches its segment.
func TestSearchFindsTaskMovedMidWalk(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	if _, err := c.Submit(ctx, "mq", tasks(200, "x"), nil); err != nil {
		t.Fatal(err)
	}
	sq := queue.SearchQuery{Limit: 1}
	p, err := c.Search(ctx, "mq", sq)
	if err != nil || p.Next == "" {
		t.Fatal(p, err)
	}
	seen := map[string]int{p.Tasks[0].ID: 1}
	if _, err := c.Cancel(ctx, "t-00150"); err != nil {
		t.Fatal(err)
	}
	sq.Limit = 1000
	for pages := 0; p.Next != ""; pages++ {
		if pages > 100 {
			t.Fatal("the search does not end")
		}
		sq.Cursor = p.Next
		if p, err = c.Search(ctx, "mq", sq); err != nil {
			t.Fatal(err)
		}
		for _, x := range p.Tasks {
			seen[x.ID]++
		}
	}
	if seen["t-00150"] == 0 || len(seen) != 200 {
		t.Fatalf("t-00150 (cancelled mid-walk) seen %d times; %d of 200 tasks found", seen["t-00150"], len(seen))
	}
}

// TestSearchLaterPageKeepsItsWindow: since relative, until absolute; the
// first page resolves the window and the cursor keeps it, so a later page
// taken after the clock moved past until is not refused for a window that
// would now end before it starts.
func TestSearchLaterPageKeepsItsWindow(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	if _, err := c.Submit(ctx, "wq", tasks(3, "x"), nil); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	until := t0.Add(10 * time.Minute).UTC().Format(time.RFC3339Nano)
	sq := queue.SearchQuery{Since: "1h", Until: until, Limit: 1}
	p, err := c.Search(ctx, "wq", sq)
	if err != nil || p.Next == "" || len(p.Tasks) != 1 {
		t.Fatalf("page 1: %+v %v", p, err)
	}
	queue.SetClock(c, func() time.Time { return t0.Add(71 * time.Minute) })
	sq.Cursor = p.Next
	if p, err = c.Search(ctx, "wq", sq); err != nil || len(p.Tasks) != 1 {
		t.Fatalf("page 2 of the same search: %+v %v", p, err)
	}
	sq.Cursor = ""
	if _, err := c.Search(ctx, "wq", sq); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("a first page whose window ends before it starts: %v, want bad input", err)
	}
}

// TestSearchSinceChecksItsBound: a since past every segment passes over
// them all unread; the page still checks its time bound on every listing
// of their names. The segments are on 40 priority levels, one listing a
// level; the clock moves 1.2 s each time it is read, so the page ends
// after its first listing with a cursor, and the walk, followed on a
// clock that stands, finds nothing.
func TestSearchSinceChecksItsBound(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	ts := tasks(4000, "x")
	for i := range ts {
		ts[i].Metadata.Priority = i / 100
	}
	if _, err := c.Submit(ctx, "sq", ts, nil); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	at, looks := time.Now(), 0
	queue.SetClock(c, func() time.Time { looks++; at = at.Add(1200 * time.Millisecond); return at })
	sq := queue.SearchQuery{Since: future, Budget: 100}
	p, err := c.Search(ctx, "sq", sq)
	if err != nil || p.Next == "" || len(p.Tasks) != 0 {
		t.Fatalf("page: %d tasks, next %q, %v: want it to end at its bound with a cursor (clock read %d times)", len(p.Tasks), p.Next, err, looks)
	}
	queue.SetClock(c, time.Now)
	sq.Cursor = p.Next
	if ids := searchAll(t, c, "sq", sq); len(ids) != 0 {
		t.Fatalf("found %d tasks created after %s", len(ids), future)
	}
}

// TestSearchSinceJumpsOverOlderSegments: a since past the 40 segments of
// one priority level is reached in one step, not by listing their names
// two at a time (the budget of 100 tasks lists 2 names a read): the page
// reads the clock twice and ends the walk, on a clock that moves 0.3 s a
// read (name by name it would pass its 1 s bound on the fifth).
func TestSearchSinceJumpsOverOlderSegments(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	if _, err := c.Submit(ctx, "jq", tasks(4000, "x"), nil); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	at, looks := time.Now(), 0
	queue.SetClock(c, func() time.Time { looks++; at = at.Add(300 * time.Millisecond); return at })
	p, err := c.Search(ctx, "jq", queue.SearchQuery{Since: future, Budget: 100})
	if err != nil || p.Next != "" || len(p.Tasks) != 0 || looks > 3 {
		t.Fatalf("page: %d tasks, next %q, %v, clock read %d times: want the walk done in one step", len(p.Tasks), p.Next, err, looks)
	}
}

// TestSearchSinceAcrossLevels: with segments on three priority levels
// submitted before since and after it, a walk in small pages finds the
// later tasks only, all of them.
func TestSearchSinceAcrossLevels(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	batch := func(prefix string) []queue.Task {
		ts := make([]queue.Task, 450)
		for i := range ts {
			ts[i] = queue.Task{ID: fmt.Sprintf("%s-%03d", prefix, i), Type: "x", Metadata: queue.Metadata{Priority: i % 3 * 10}}
		}
		return ts
	}
	if _, err := c.Submit(ctx, "lq", batch("old"), nil); err != nil {
		t.Fatal(err)
	}
	since := time.Now()
	for !time.Now().After(since) {
	}
	if _, err := c.Submit(ctx, "lq", batch("new"), nil); err != nil {
		t.Fatal(err)
	}
	ids := searchAll(t, c, "lq", queue.SearchQuery{Since: since.UTC().Format(time.RFC3339Nano), Budget: 100, Limit: 7})
	sort.Strings(ids)
	if len(ids) != 450 || ids[0] != "new-000" || ids[449] != "new-449" || len(slices.Compact(slices.Clone(ids))) != 450 {
		t.Fatalf("found %d tasks (%v...), want new-000 to new-449", len(ids), ids[:min(3, len(ids))])
	}
}

// spreadTasks submits n tasks p-00000... to queue q, each on one of 50
// priority levels in turn, so that ids next to each other are in other
// segments.
func spreadTasks(t *testing.T, c *queue.Client, q string, n int) {
	t.Helper()
	ts := make([]queue.Task, n)
	for i := range ts {
		ts[i] = queue.Task{ID: fmt.Sprintf("p-%05d", i), Type: "x", Metadata: queue.Metadata{Priority: i % 50}}
	}
	if _, err := c.Submit(context.Background(), q, ts, nil); err != nil {
		t.Fatal(err)
	}
}

// TestSearchIDPrefixCountsSegments: an id-prefix page reads each task's
// segment to resolve it, and counts that segment's tasks against its
// budget: with ids each in another segment and a budget of 1,000 tasks a
// page takes about ten ids, not the 200 of one read of the index, and the
// walk still finds every task.
func TestSearchIDPrefixCountsSegments(t *testing.T) {
	c, _ := newClient(t, etcdtest.Namespace(t))
	spreadTasks(t, c, "pq", 1000)
	sq := queue.SearchQuery{IDPrefix: "p-", Budget: 1000, Limit: 1000}
	p, err := c.Search(context.Background(), "pq", sq)
	if err != nil || p.Next == "" || len(p.Tasks) > 20 || p.Scanned < 100*len(p.Tasks) {
		t.Fatalf("page: %d tasks, scanned %d, next %q, %v: want about 10 tasks and their segments counted", len(p.Tasks), p.Scanned, p.Next, err)
	}
	if ids := searchAll(t, c, "pq", sq); len(ids) != 1000 || len(slices.Compact(slices.Clone(ids))) != 1000 {
		t.Fatalf("the walk found %d tasks, want 1000 once each", len(ids))
	}
}

// TestSearchIDPrefixChecksItsTime: an id-prefix page checks its time
// bound after each read of tasks, not once per 200 ids: on a clock that
// moves 1.2 s each time it is read, the page ends after one read of
// tasks (40 at most).
func TestSearchIDPrefixChecksItsTime(t *testing.T) {
	c, _ := newClient(t, etcdtest.Namespace(t))
	spreadTasks(t, c, "tq", 400)
	at := time.Now()
	queue.SetClock(c, func() time.Time { at = at.Add(1200 * time.Millisecond); return at })
	p, err := c.Search(context.Background(), "tq", queue.SearchQuery{IDPrefix: "p-", Limit: 1000})
	if err != nil || p.Next == "" || len(p.Tasks) > 40 {
		t.Fatalf("page: %d tasks, next %q, %v: want at most one read of tasks past its bound", len(p.Tasks), p.Next, err)
	}
}

// TestSearchQueueDeletedMidWalk: every page looks the queue up, so a
// later page of a queue deleted since is ErrNoQueue (a 404 over HTTP),
// as the first page would be, not an empty page.
func TestSearchQueueDeletedMidWalk(t *testing.T) {
	ctx := context.Background()
	c, _ := newClient(t, etcdtest.Namespace(t))
	if _, err := c.Submit(ctx, "dq", tasks(5, "x"), nil); err != nil {
		t.Fatal(err)
	}
	p, err := c.Search(ctx, "dq", queue.SearchQuery{Limit: 2})
	if err != nil || p.Next == "" {
		t.Fatal(p, err)
	}
	if _, err := c.DeleteQueue(ctx, "dq", nil); err != nil {
		t.Fatal(err)
	}
	if p, err = c.Search(ctx, "dq", queue.SearchQuery{Limit: 2, Cursor: p.Next}); !errors.Is(err, queue.ErrNoQueue) {
		t.Fatalf("a later page of a deleted queue: %d tasks, %v; want ErrNoQueue", len(p.Tasks), err)
	}
}
