package queue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/cursor"
	"github.com/droverhq/drover/internal/paramfilter"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ParamFilter selects tasks whose parameters (a JSON object) hold Key with
// Value: the same JSON value when Value parses as JSON (4411, true,
// "x"), or a string equal to Value as given.
type ParamFilter struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// SearchQuery selects a page of a queue's tasks. Every filter given must
// hold; the zero query finds every task of the queue.
type SearchQuery struct {
	// Status is the tasks' current status; "" for any.
	Status Status
	// Type is the tasks' task_type; "" for any.
	Type string
	// IDPrefix is how the tasks' ids start; "" for any.
	IDPrefix string
	// Params are parameters the tasks must hold (all of them).
	Params []ParamFilter
	// Since and Until bound the tasks' creation time (created_at): since
	// inclusive, until exclusive. Each is a time in RFC 3339 or a duration
	// back from now ("1h", "90m"); "" for no bound.
	Since, Until string
	// Limit is the most tasks the page holds: 0 means DefaultListLimit,
	// at most MaxListLimit.
	Limit int
	// Cursor is the Next of the page before, from the same query.
	Cursor string
	// Budget is the most tasks one page reads (a segment counts its
	// tasks): 0 means DefaultSearchBudget. A page that spends it ends
	// there, short or empty, with a Next to go on from.
	Budget int
}

// SearchPage is one page of a search. Next, when not empty, continues the
// search as SearchQuery.Cursor; it is empty once the walk is complete. A
// page may be short, or empty, and still have a Next: the page's read
// budget ran out first.
type SearchPage struct {
	Tasks []*Task `json:"data"`
	Next  string  `json:"next_cursor,omitempty"`
	// Scanned counts the tasks (and index keys) the page read.
	Scanned int `json:"scanned"`
}

// DefaultSearchBudget is how many tasks a page of a search reads at most
// (200 segments), which bounds the time of every page whatever the
// filters. MaxParamFilters bounds the parameter filters of a query.
// A page also ends once it has read for SearchPageTime, whatever its
// budget left.
const (
	DefaultSearchBudget = 200 * SegmentSize
	SearchPageTime      = time.Second
	MaxParamFilters     = paramfilter.MaxFilters
)

// searchStatuses lists the statuses in the order a search without a status
// walks their indexes of tasks with records of their own.
var searchStatuses = []Status{Pending, Running, Retrying, Sleeping, Waiting, Dead, Succeeded, Cancelled}

// search is one page's walk.
type search struct {
	c            *Client
	q            string
	st           Status
	typ, prefix  string
	params       []paramfilter.Filter
	since, until time.Time
	limit        int
	budget       int
	deadline     time.Time
	cur          cursor.Cursor
	// segsRead are the segments the page's id walk read tasks from.
	segsRead map[string]bool
	// start is where the segment walk of the page began: its segment,
	// and the last slot of it an earlier page walked.
	start struct {
		seg  string
		slot int
	}
	page SearchPage
}

// Search returns a page of queue q's tasks that match sq: first the tasks
// in segments, by priority and submission, then the tasks with records of
// their own (retried, dead, cancelled, handed back), status by status. A
// task moves one way only, segment to record, so one that moves during the
// walk is listed at least once (twice if passed before it moved). An id
// prefix is a range read of the id index; a status walks only the indexes
// and segments that can hold it; the other filters are checked on the
// tasks read. docs/queue.md, "Finding a task", says what each costs.
func (c *Client) Search(ctx context.Context, q string, sq SearchQuery) (SearchPage, error) {
	s, err := c.newSearch(q, sq)
	if err != nil {
		return SearchPage{}, err
	}
	// Every page: a queue deleted during the walk is a 404, not empty pages.
	if ok, err := c.Exists(ctx, q); err != nil || !ok {
		return SearchPage{}, cmp.Or(err, noQueue(q))
	}
	s.page.Tasks = []*Task{}
	var done bool
	switch s.cur.Phase {
	case cursor.PhaseIDs:
		done, err = s.walkIDs(ctx)
	case cursor.PhaseSegments:
		if done, err = s.walkSegments(ctx); err == nil && done {
			s.cur = cursor.Cursor{Digest: s.cur.Digest, Phase: cursor.PhaseRecords, Since: s.cur.Since, Until: s.cur.Until}
			done, err = s.walkRecords(ctx)
		}
	default:
		done, err = s.walkRecords(ctx)
	}
	if err != nil {
		return SearchPage{}, err
	}
	if !done {
		s.page.Next = cursor.Encode(s.cur)
	}
	return s.page, nil
}

// newSearch checks sq and makes the walk it asks for.
func (c *Client) newSearch(q string, sq SearchQuery) (*search, error) {
	if err := CheckQueue(q); err != nil {
		return nil, err
	}
	s := &search{c: c, q: q, st: Status(strings.ToUpper(string(sq.Status))), typ: sq.Type, prefix: sq.IDPrefix,
		limit: cmp.Or(sq.Limit, DefaultListLimit), budget: cmp.Or(sq.Budget, DefaultSearchBudget), segsRead: map[string]bool{}}
	if s.st != "" {
		if _, err := c.statusPrefix(q, s.st); err != nil {
			return nil, err
		}
	}
	if sq.Limit < 0 || sq.Limit > MaxListLimit {
		return nil, &drover.InputError{Field: "limit", Value: sq.Limit, Rule: fmt.Sprintf("must be between 1 and %d", MaxListLimit)}
	}
	if sq.Budget < 0 {
		return nil, &drover.InputError{Field: "budget", Value: sq.Budget, Rule: "must not be negative (0: the default)"}
	}
	if s.typ != "" {
		if err := keyspace.CheckName("type", s.typ); err != nil {
			return nil, err
		}
	}
	if err := checkIDPrefix(s.prefix); err != nil {
		return nil, err
	}
	pairs := make([][2]string, len(sq.Params))
	for i, p := range sq.Params {
		pairs[i] = [2]string{p.Key, p.Value}
	}
	var err error
	if s.params, err = paramfilter.Parse(pairs); err != nil {
		return nil, err
	}
	now := c.now()
	s.deadline = now.Add(SearchPageTime)
	if s.since, err = cursor.ParseTime("since", sq.Since, now); err != nil {
		return nil, err
	}
	if s.until, err = cursor.ParseTime("until", sq.Until, now); err != nil {
		return nil, err
	}
	// A later page takes the window the first resolved (setCursor): "1h"
	// against a fixed until must not turn backwards as the clock moves on.
	if sq.Cursor == "" && !s.since.IsZero() && !s.until.IsZero() && !s.until.After(s.since) {
		return nil, &drover.InputError{Field: "until", Value: sq.Until,
			Rule: fmt.Sprintf("must be after since (%s): the time range ends before it starts", s.since.UTC().Format(time.RFC3339))}
	}
	return s, s.setCursor(sq)
}

// setCursor starts the walk where sq's cursor says, or at the beginning.
func (s *search) setCursor(sq SearchQuery) error {
	parts := []string{s.q, string(s.st), s.typ, s.prefix, sq.Since, sq.Until}
	for _, p := range s.params {
		parts = append(parts, p.Key, p.Value)
	}
	digest := cursor.Digest(parts...)
	if sq.Cursor == "" {
		s.cur = cursor.Cursor{Digest: digest, Phase: cursor.PhaseSegments, Slot: -1}
		s.cur.SetWindow(s.since, s.until)
		if s.prefix != "" {
			s.cur.Phase = cursor.PhaseIDs
		}
		return nil
	}
	cur, err := cursor.Decode(sq.Cursor)
	if err != nil {
		return &drover.InputError{Field: "cursor", Value: sq.Cursor, Rule: "must be the next_cursor of a page of this search"}
	}
	if cur.Digest != digest {
		return &drover.InputError{Field: "cursor", Value: sq.Cursor,
			Rule: "was given by another query: pass a cursor only with the queue and filters of the search that gave it"}
	}
	if !s.inRange(cur) {
		return &drover.InputError{Field: "cursor", Value: sq.Cursor, Rule: "must be the next_cursor of a page of this search: its place is out of range"}
	}
	s.cur = cur
	s.since, s.until = cur.Window() // the window the first page saw
	return nil
}

// inRange reports whether cursor c's place is one this search's walk can
// be at: anyone can write a cursor and its digest.
func (s *search) inRange(c cursor.Cursor) bool {
	switch c.Phase {
	case cursor.PhaseIDs:
		return s.prefix != ""
	case cursor.PhaseRecords:
		return s.prefix == "" && c.Index <= len(s.recordStatuses())
	}
	return s.prefix == "" && c.Slot <= SegmentSize
}

// checkIDPrefix refuses a prefix no task id can start with.
func checkIDPrefix(p string) error {
	if p == "" || p == "." || p == ".." {
		return nil
	}
	if err := keyspace.CheckName("id_prefix", p); err != nil {
		return &drover.InputError{Field: "id_prefix", Value: p, Rule: "must be how a task id starts: " + strings.TrimPrefix(keyspace.NameRule, "must be ")}
	}
	return nil
}

// matches reports whether t passes the filters that are read from the task
// itself (every one but the status).
func (s *search) matches(t *Task) bool {
	switch {
	case t == nil, t.Queue != s.q:
		return false
	case s.typ != "" && t.Type != s.typ, s.prefix != "" && !strings.HasPrefix(t.ID, s.prefix):
		return false
	case !s.since.IsZero() && t.Metadata.CreatedAt.Before(s.since), !s.until.IsZero() && !t.Metadata.CreatedAt.Before(s.until):
		return false
	}
	if len(s.params) == 0 {
		return true
	}
	for _, p := range s.params {
		if !p.Match(t.Parameters) {
			return false
		}
	}
	return true
}

// add puts t on the page; it reports whether the page is full.
func (s *search) add(t *Task) bool {
	s.page.Tasks = append(s.page.Tasks, t)
	return len(s.page.Tasks) >= s.limit
}

// spent reports whether the page has read its budget.
func (s *search) spent() bool {
	return s.page.Scanned >= s.budget || s.c.now().After(s.deadline)
}

// idChunk is how many keys of the id index one read takes.
const idChunk = 200

// walkIDs walks the id index from the cursor's id on: a range read of the
// ids that start with the prefix, in every queue (the index is shared),
// then their tasks, a few at a time (idBatch), with the page's bounds
// checked after each. It reports whether the walk is complete.
func (s *search) walkIDs(ctx context.Context) (bool, error) {
	base := s.c.keys.TaskIndex("")
	pre := base + s.prefix
	for {
		from := pre
		if s.cur.Key != "" {
			from = base + s.cur.Key + "\x00"
		}
		g, err := s.c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithLimit(idChunk))
		if err != nil {
			return false, fmt.Errorf("queue: search %s: %w", s.q, err)
		}
		for kvs := g.Kvs; len(kvs) > 0; {
			ids, n := s.idBatch(kvs)
			if full, err := s.takeIDs(ctx, ids); err != nil || full {
				return false, err
			}
			s.cur.Key = strings.TrimPrefix(string(kvs[n-1].Key), base)
			if kvs = kvs[n:]; s.spent() && (len(kvs) > 0 || g.More) {
				return false, nil
			}
		}
		if len(g.Kvs) == 0 || !g.More {
			return true, nil
		}
	}
}

// idBatch returns the ids of this queue's tasks among the first keys of
// the id index kvs that one read of tasks takes, and how many keys it took:
// up to readBatch, and no more than the page's budget has left (one at
// least). It counts them as scanned: a key one, a segment the tasks are
// read from (not read before in the page) its size.
func (s *search) idBatch(kvs []*mvccpb.KeyValue) (ids []string, n int) {
	base := s.c.keys.TaskIndex("")
	left := max(1, s.budget-s.page.Scanned)
	cost := 0
	for n < len(kvs) && n < readBatch && cost < left {
		kv := kvs[n]
		n, cost = n+1, cost+1
		p, ok := keyspace.ParseTaskPlace(string(kv.Value))
		if !ok || p.Queue != s.q {
			continue
		}
		ids = append(ids, strings.TrimPrefix(string(kv.Key), base))
		if !s.segsRead[p.Segment] {
			s.segsRead[p.Segment] = true
			cost += SegmentSize
		}
	}
	s.page.Scanned += cost
	return ids, n
}

// takeIDs reads the tasks ids and adds those that match to the page; it
// reports whether the page filled, the cursor at the last task added.
func (s *search) takeIDs(ctx context.Context, ids []string) (bool, error) {
	tasks, err := s.c.getSkipping(ctx, ids)
	if err != nil {
		return false, err
	}
	for _, t := range tasks {
		if (s.st == "" || t.CurrentStatus == s.st) && s.matches(t) && s.add(t) {
			s.cur.Key = t.ID
			return true, nil
		}
	}
	return false, nil
}

// recordStatuses are the statuses whose indexes of tasks with records of
// their own the search walks.
func (s *search) recordStatuses() []Status {
	switch s.st {
	case "":
		return searchStatuses
	case Scheduled: // only in segments
		return nil
	}
	return []Status{s.st}
}

// recordChunk is how many index keys of tasks with records one read takes.
const recordChunk = 200

// walkRecords walks the indexes of tasks with records of their own, status
// by status (cursor: the status's place in recordStatuses and the last key
// read). A task is taken in the index of its current status only, so a
// task whose keys are in two indexes for a moment is found once.
func (s *search) walkRecords(ctx context.Context) (bool, error) {
	sts := s.recordStatuses()
	for ; s.cur.Index < len(sts); s.cur.Index, s.cur.Key = s.cur.Index+1, "" {
		st := sts[s.cur.Index]
		prefix, _ := s.c.statusPrefix(s.q, st)
		for {
			from := prefix
			if s.cur.Key != "" {
				from = prefix + s.cur.Key + "\x00"
			}
			g, err := s.c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(recordChunk))
			if err != nil {
				return false, fmt.Errorf("queue: search %s: %w", s.q, err)
			}
			ids := make([]string, len(g.Kvs))
			for i, kv := range g.Kvs {
				ids[i] = idOfIndexKey(st, string(kv.Key), prefix)
			}
			s.page.Scanned += len(ids)
			tasks, err := s.c.getSkipping(ctx, ids)
			if err != nil {
				return false, err
			}
			by := make(map[string]*Task, len(tasks))
			for _, t := range tasks {
				by[t.ID] = t
			}
			for i, kv := range g.Kvs {
				if t := by[ids[i]]; t != nil && t.CurrentStatus == st && s.matches(t) && s.add(t) {
					s.cur.Key = keyspace.Rest(prefix, string(kv.Key))
					return false, nil
				}
			}
			if len(g.Kvs) == 0 || !g.More {
				break
			}
			s.cur.Key = keyspace.Rest(prefix, string(g.Kvs[len(g.Kvs)-1].Key))
			if s.spent() {
				return false, nil
			}
		}
	}
	return true, nil
}

// segBatch is how many segments' records one read takes.
const segBatch = 32

// segmentsFrom returns the segments from segment from on that may hold
// tasks the search finds, and whether there are more: every segment of the
// queue, or with a status the ones its indexes name.
func (s *search) segmentsFrom(ctx context.Context, from string) ([]string, bool, error) {
	switch {
	case s.st == "":
		return s.allSegments(ctx, from)
	case segmentStatus(s.st):
		return s.c.segmentsWith(ctx, s.q, s.st, from)
	}
	return nil, false, nil
}

// allSegments returns the queue's segments from segment from on, as many
// as the page's budget has left to read (and one), and whether there are
// more: a keys-only read of the segments' names.
func (s *search) allSegments(ctx context.Context, from string) ([]string, bool, error) {
	pre := s.c.keys.Segments(s.q)
	n := max(0, s.budget-s.page.Scanned)/SegmentSize + 1
	g, err := s.c.cli.Get(ctx, pre+from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(min(n, 4096))))
	if err != nil {
		return nil, false, fmt.Errorf("queue: search %s: %w", s.q, err)
	}
	out := make([]string, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		if seg, ok := keyspace.Last(pre, string(kv.Key)); ok {
			out = append(out, seg)
		}
	}
	return out, g.More, nil
}

// walkSegments walks the segments from the cursor's on (cursor: the
// segment and the last slot of it already walked, or a key to list on
// from). A segment submitted before since is passed over unread: its tasks
// were created before it; the walk lists on from since's place in that
// segment's priority level, so the names of older segments are not read
// either. The page's bounds are checked on every listing.
func (s *search) walkSegments(ctx context.Context) (bool, error) {
	from := s.cur.Key
	s.start.seg, s.start.slot = s.cur.Key, s.cur.Slot
	for {
		segs, more, err := s.segmentsFrom(ctx, from)
		if err != nil {
			return false, err
		}
		todo, jump := s.toWalk(segs)
		for len(todo) > 0 {
			// A batch no bigger than the budget left (and one segment at least).
			n := min(segBatch, len(todo), max(1, (s.budget-s.page.Scanned+SegmentSize-1)/SegmentSize))
			batch := todo[:n]
			todo = todo[len(batch):]
			full, err := s.searchSegments(ctx, batch)
			if err != nil || full {
				return false, err
			}
			if s.spent() && (len(todo) > 0 || more || jump != "") {
				return false, nil
			}
		}
		switch {
		case jump != "":
			from = jump
		case !more || len(segs) == 0:
			return true, nil
		default:
			from = segs[len(segs)-1] + "0" // past every key of the last segment
		}
		if s.spent() {
			s.cur.Key, s.cur.Slot = from, -1
			return false, nil
		}
	}
}

// toWalk returns the segments of segs the walk reads: not the one an
// earlier page walked to its end, nor those submitted before since. At the
// first of those it stops, and returns where the segments of its level
// submitted at since start, to list on from; "" to go on past segs. The
// due index (SCHEDULED) is in due order, not by name: its segments are
// passed over one by one.
func (s *search) toWalk(segs []string) (todo []string, jump string) {
	for _, seg := range segs {
		if seg == s.start.seg && s.start.slot >= SegmentSize {
			continue
		}
		lv, at, ok := keyspace.ParseSegmentName(seg)
		if !ok || s.since.IsZero() || !at.Before(s.since) {
			todo = append(todo, seg)
			continue
		}
		// A since past 2262 has no UnixNano: go on name by name.
		if b := keyspace.SegmentBound("", lv, s.since); s.st != Scheduled && b > seg {
			return todo, b
		}
	}
	return todo, ""
}

// searchSegments reads the records of segments segs in one request and
// takes their tasks that match; it reports whether the page filled.
func (s *search) searchSegments(ctx context.Context, segs []string) (bool, error) {
	ops := make([]clientv3.Op, len(segs))
	for i, seg := range segs {
		ops[i] = clientv3.OpGet(s.c.keys.Segment(s.q, seg))
	}
	resp, err := s.c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("queue: search %s: %w", s.q, err)
	}
	if testHookSearchRecords != nil {
		testHookSearchRecords()
	}
	for i, seg := range segs {
		s.cur.Key, s.cur.Slot = seg, SegmentSize // walked, unless the page fills in it
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // removed after its retention
		}
		ts, err := decodeSegment(kvs[0].Value)
		if err != nil && !errors.Is(err, errSegmentFormat) { // (a newer drover's: skipped, its servers search it)
			err = s.c.unreadable(ctx, s.q, seg, fmt.Errorf("queue: segment %s of %s is unreadable: %w", seg, s.q, err))
		}
		if errors.Is(err, errSegmentFormat) || errors.Is(err, ErrQuarantined) {
			continue // skipped (a quarantined one is out of the queue until repaired)
		} else if err != nil {
			return false, err
		}
		s.page.Scanned += len(ts)
		full, err := s.takeSegment(ctx, seg, ts)
		if err != nil || full {
			return full, err
		}
	}
	return false, nil
}

// testHookSearchRecords, set by tests only, runs after a search read
// segments' records and before it reads their states.
var testHookSearchRecords func()

// takeSegment adds segment seg's tasks ts that match to the page, reading
// the segment's state only when a task passes the other filters.
func (s *search) takeSegment(ctx context.Context, seg string, ts []Task) (bool, error) {
	var state *segState
	for slot := range ts {
		if seg == s.start.seg && slot <= s.start.slot {
			continue
		}
		t, _ := taskOf(ts, slot)
		t.Queue = s.q
		if !s.matches(t) {
			continue
		}
		if state == nil {
			var err error
			if state, err = s.c.readState(ctx, s.q, seg); err != nil {
				return false, err
			}
			if state.vanished() {
				return false, nil // gathered since its record was read: its tasks are in another
			}
			if !state.open && state.n == 0 {
				state.n = len(ts)
			}
		}
		if !state.fill(t, slot) || (s.st != "" && t.CurrentStatus != s.st) {
			continue // a task that left its segment is found by its record
		}
		t.seg = &segRef{queue: s.q, seg: seg, slot: slot, rev: state.rev}
		if s.add(t) {
			s.cur.Key, s.cur.Slot = seg, slot
			return true, nil
		}
	}
	return false, nil
}
