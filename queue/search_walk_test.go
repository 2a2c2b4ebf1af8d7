package queue_test

import (
	"context"
	"errors"
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
		{Digest: digest, Phase: "r", Index: -1}, {Digest: digest, Phase: "r", Index: 7},
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
