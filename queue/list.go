package queue

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Get returns task id with its current status.
func (c *Client) Get(ctx context.Context, id string) (*Task, error) {
	if err := keyspace.CheckName("task id", id); err != nil {
		return nil, err
	}
	ts, err := c.getMany(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return ts[0], nil
}

// readBatch is how many tasks one read transaction takes: resolving a
// task's status reads three keys, and etcd allows 128 operations a request
// by default (--max-txn-ops).
const readBatch = 40

// getMany reads the tasks ids (skipping missing ones): a task with a
// record of its own has its status resolved from its index keys; a task in
// a segment, from its segment's state. Two or three read transactions per
// readBatch ids, and one per segment.
func (c *Client) getMany(ctx context.Context, ids []string) ([]*Task, error) {
	return c.readTasks(ctx, ids, true)
}

// readTasks is getMany; inSegments false reads records only.
func (c *Client) readTasks(ctx context.Context, ids []string, inSegments bool) ([]*Task, error) {
	var out []*Task
	for start := 0; start < len(ids); start += readBatch {
		chunk := ids[start:min(start+readBatch, len(ids))]
		ops := make([]clientv3.Op, 0, 2*len(chunk))
		for _, id := range chunk {
			ops = append(ops, clientv3.OpGet(c.keys.TaskRecord(id)), clientv3.OpGet(c.keys.TaskIndex(id)))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("queue: read tasks: %w", err)
		}
		var tasks []*Task
		var inSeg []segmentSlot
		for i, id := range chunk {
			kvs := resp.Responses[2*i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				if !inSegments {
					continue
				}
				if ix := resp.Responses[2*i+1].GetResponseRange().Kvs; len(ix) > 0 {
					if v, ok := keyspace.ParseTaskPlace(string(ix[0].Value)); ok {
						inSeg = append(inSeg, segmentSlot{id: id, at: v})
					}
				}
				continue
			}
			t := new(Task)
			if err := json.Unmarshal(kvs[0].Value, t); err != nil {
				return nil, fmt.Errorf("queue: task record %s is unreadable: %w", kvs[0].Key, err)
			}
			t.rev = kvs[0].ModRevision
			tasks = append(tasks, t)
		}
		if tasks, err = c.resolveFresh(ctx, tasks); err != nil {
			return nil, err
		}
		for _, t := range tasks {
			if t.CurrentStatus != Waiting {
				// Woken, or not waiting: the record keeps the wait its
				// next claim resumes at (Outcome.Received), not shown.
				t.resumes, t.WaitingFor = t.WaitingFor, nil
			} else {
				fillStoredWait(t)
			}
		}
		segTasks, moved, err := c.segmentSlots(ctx, inSeg)
		if err != nil {
			return nil, err
		}
		if len(moved) > 0 { // they left their segment after the first read
			again, err := c.readTasks(ctx, moved, false)
			if err != nil {
				return nil, err
			}
			segTasks = append(segTasks, again...)
		}
		out = append(out, mergeByID(chunk, tasks, segTasks)...)
	}
	return out, nil
}

// fillStoredWait puts back into task t, just decoded from its record, the
// bounds of its wait that storedWait left out: when it began and when it
// times out. Call it before anything changes t's status or ScheduledAt
// (a claim's decode, while ScheduledAt is still the wait's due time).
func fillStoredWait(t *Task) {
	if t.WaitingFor != nil && t.CurrentStatus == Waiting { // others keep it whole (recordOps)
		t.WaitingFor.Fill(t.waitBounds())
	}
}

// mergeByID returns the tasks of a and b in the order of ids.
func mergeByID(ids []string, a, b []*Task) []*Task {
	if len(b) == 0 {
		return a
	}
	by := make(map[string]*Task, len(a)+len(b))
	for _, t := range append(a, b...) {
		by[t.ID] = t
	}
	out := make([]*Task, 0, len(by))
	for _, id := range ids {
		if t, ok := by[id]; ok {
			out = append(out, t)
			delete(by, id)
		}
	}
	return out
}

// staleTries bounds how many times resolveFresh reads again the records
// that changed under it.
const staleTries = 5

// resolveFresh is resolve, with the tasks whose records changed between
// their read and the read of their keys read again: a status resolved from
// a record and keys of two moments may be one the task never had (a record
// read SLEEPING, and keys read after the task woke, ran and succeeded, say
// SLEEPING still). Tasks whose records went are left out.
func (c *Client) resolveFresh(ctx context.Context, tasks []*Task) ([]*Task, error) {
	for try := 0; ; try++ {
		stale, err := c.resolve(ctx, tasks)
		if err != nil || len(stale) == 0 || try == staleTries {
			return tasks, err
		}
		ids := make([]string, len(stale))
		for i, t := range stale {
			ids[i] = t.ID
		}
		again, err := c.readRecords(ctx, ids)
		if err != nil {
			return nil, err
		}
		by := make(map[string]*Task, len(again))
		for _, t := range again {
			by[t.ID] = t
		}
		kept := tasks[:0:0]
		for _, t := range tasks {
			if slices.Contains(stale, t) {
				if t = by[t.ID]; t == nil {
					continue // its record went
				}
			}
			kept = append(kept, t)
		}
		tasks = kept
	}
}

// readRecords reads the records of tasks ids, in one transaction (at most
// readBatch ids), skipping missing ones.
func (c *Client) readRecords(ctx context.Context, ids []string) ([]*Task, error) {
	ops := make([]clientv3.Op, len(ids))
	for i, id := range ids {
		ops[i] = clientv3.OpGet(c.keys.TaskRecord(id))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("queue: read tasks: %w", err)
	}
	var out []*Task
	for i := range ids {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		t := new(Task)
		if err := json.Unmarshal(kvs[0].Value, t); err != nil {
			return nil, fmt.Errorf("queue: task record %s is unreadable: %w", kvs[0].Key, err)
		}
		t.rev = kvs[0].ModRevision
		out = append(out, t)
	}
	return out, nil
}

// resolveBatch is how many tasks' keys resolve reads in one transaction:
// four each, within etcd's 128 operations a request.
const resolveBatch = 30

// resolve sets each task's CurrentStatus from where its keys are: a claim
// means RUNNING; otherwise a terminal status in the record stands; otherwise
// a retry key means RETRYING (a sleep key, for a record that says so,
// SLEEPING; a wait key, WAITING) and a pending key PENDING. It reads at most resolveBatch
// tasks' keys per transaction, each with its record's revision: it returns
// the tasks whose records changed since they were read.
func (c *Client) resolve(ctx context.Context, tasks []*Task) (stale []*Task, err error) {
	for len(tasks) > resolveBatch {
		more, err := c.resolve(ctx, tasks[:resolveBatch])
		if err != nil {
			return nil, err
		}
		stale, tasks = append(stale, more...), tasks[resolveBatch:]
	}
	if len(tasks) == 0 {
		return stale, nil
	}
	ops := make([]clientv3.Op, 0, 4*len(tasks))
	for _, t := range tasks {
		ops = append(ops,
			clientv3.OpGet(c.keys.QueueClaim(t.Queue, t.ID)),
			clientv3.OpGet(c.pendingKey(t), clientv3.WithKeysOnly()),
			clientv3.OpGet(c.waitKey(t), clientv3.WithCountOnly()),
			clientv3.OpGet(c.keys.TaskRecord(t.ID), clientv3.WithKeysOnly()))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("queue: read task states: %w", err)
	}
	for i, t := range tasks {
		if rec := resp.Responses[4*i+3].GetResponseRange().Kvs; len(rec) == 0 || rec[0].ModRevision != t.rev {
			stale = append(stale, t)
			continue
		}
		claim := resp.Responses[4*i].GetResponseRange().Kvs
		pend := resp.Responses[4*i+1].GetResponseRange().Kvs
		pending := len(pend) > 0
		t.pendingRev = 0
		if pending {
			t.pendingRev = pend[0].ModRevision
		}
		retry := resp.Responses[4*i+2].GetResponseRange().Count > 0
		switch {
		case len(claim) > 0:
			var cv claimValue
			_ = json.Unmarshal(claim[0].Value, &cv)
			t.CurrentStatus, t.Attempt, t.Token = Running, cv.Attempt, claim[0].CreateRevision
		case t.CurrentStatus.Terminal():
		case retry && (t.CurrentStatus == Sleeping || t.CurrentStatus == Waiting):
		case retry:
			t.CurrentStatus = Retrying
		case pending:
			t.CurrentStatus = Pending
		}
	}
	return stale, nil
}

// DefaultListLimit is how many tasks a page of List holds when no limit is
// given; MaxListLimit is the most it can hold.
const (
	DefaultListLimit = 100
	MaxListLimit     = 1000
)

// ListOptions selects a page of a listing.
type ListOptions struct {
	// Limit is the most tasks the page holds: 0 means DefaultListLimit,
	// at most MaxListLimit.
	Limit int
	// After is the cursor of the page before (its Page.Next): the page
	// starts after it. Empty starts at the beginning.
	After string
}

// Page is one page of a listing. Next, when not empty, is the cursor that
// gives the next page as ListOptions.After; empty means this was the last.
type Page struct {
	Tasks []*Task `json:"tasks"`
	Next  string  `json:"next,omitempty"`
}

// maxCursor bounds the length of a listing cursor.
const maxCursor = 512

// List returns a page of queue q's tasks in status st, in index order
// (pending tasks by shard, then priority and submission; retrying ones by
// when they are due; finished ones by when they finished; running and dead
// ones by id). Walking every page with Next sees each task that stays in
// that status once, even while tasks come and go.
func (c *Client) List(ctx context.Context, q string, st Status, opts ListOptions) (Page, error) {
	if err := CheckQueue(q); err != nil {
		return Page{}, err
	}
	if opts.Limit < 0 || opts.Limit > MaxListLimit {
		return Page{}, &drover.InputError{Field: "limit", Value: opts.Limit, Rule: fmt.Sprintf("must be between 1 and %d", MaxListLimit)}
	}
	if err := checkCursor(opts.After); err != nil {
		return Page{}, err
	}
	if _, err := c.statusPrefix(q, st); err != nil {
		return Page{}, err
	}
	limit := cmp.Or(opts.Limit, DefaultListLimit)
	// Tasks with records of their own first (cursor "t/..."), then the
	// tasks in segments (cursor "s/...").
	after, inSegs := strings.CutPrefix(opts.After, "s/")
	page := Page{Tasks: []*Task{}}
	if !inSegs && st != Scheduled {
		p, err := c.listRecords(ctx, q, st, ListOptions{Limit: limit, After: strings.TrimPrefix(opts.After, "t/")})
		if err != nil || p.Next != "" {
			if p.Next != "" {
				p.Next = "t/" + p.Next
			}
			return p, err
		}
		page.Tasks, after = p.Tasks, ""
		if len(page.Tasks) == limit {
			if segmentStatus(st) {
				page.Next = "s/"
			}
			return page, nil
		}
	}
	if !segmentStatus(st) {
		return page, nil
	}
	more, next, err := c.listSegments(ctx, q, st, after, limit-len(page.Tasks))
	page.Tasks = append(page.Tasks, more...)
	if next != "" {
		page.Next = "s/" + next
	}
	return page, err
}

// listRecords lists tasks with records of their own, from their indexes.
func (c *Client) listRecords(ctx context.Context, q string, st Status, opts ListOptions) (Page, error) {
	limit := opts.Limit
	if limit == 0 {
		limit = DefaultListLimit
	}
	if limit < 0 || limit > MaxListLimit {
		return Page{}, &drover.InputError{Field: "limit", Value: opts.Limit, Rule: fmt.Sprintf("must be between 1 and %d", MaxListLimit)}
	}
	if err := checkCursor(opts.After); err != nil {
		return Page{}, err
	}
	prefix, err := c.statusPrefix(q, st)
	if err != nil {
		return Page{}, err
	}
	claimed := map[string]bool{}
	if st == Pending {
		// A pending key whose task is running stays until its outcome:
		// leave those out.
		g, err := c.cli.Get(ctx, c.keys.QueueClaims(q), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return Page{}, fmt.Errorf("queue: list %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			id, _ := keyspace.Last(c.keys.QueueClaims(q), string(kv.Key))
			claimed[id] = true
		}
	}
	var ids []string
	from, end := prefix+opts.After, clientv3.GetPrefixRangeEnd(prefix)
	if opts.After != "" {
		from += "\x00" // just after the cursor's key
	}
	page := Page{}
	last, more := "", false
	for len(ids) < limit {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit-len(ids)+len(claimed))))
		if err != nil {
			return Page{}, fmt.Errorf("queue: list %s: %w", q, err)
		}
		more = g.More
		for k, kv := range g.Kvs {
			key := string(kv.Key)
			last = keyspace.Rest(prefix, key)
			if id := idOfIndexKey(st, key, prefix); !claimed[id] {
				if ids = append(ids, id); len(ids) == limit {
					more = more || k < len(g.Kvs)-1
					break
				}
			}
		}
		if !g.More {
			break
		}
		from = prefix + last + "\x00"
	}
	if more {
		page.Next = last
	}
	page.Tasks, err = c.getMany(ctx, ids)
	if page.Tasks == nil {
		page.Tasks = []*Task{}
	}
	return page, err
}

// statusPrefix is the index of tasks in status st.
func (c *Client) statusPrefix(q string, st Status) (string, error) {
	switch st {
	case Scheduled: // only segments: no task record is scheduled
		return c.keys.QueueDue(q), nil
	case Pending:
		return c.keys.QueuePending(q), nil
	case Running:
		return c.keys.QueueClaims(q), nil
	case Retrying:
		return c.keys.QueueRetry(q), nil
	case Sleeping:
		return c.keys.QueueSleep(q), nil
	case Waiting:
		return c.keys.QueueWait(q), nil
	case Dead:
		return c.keys.QueueDead(q), nil
	case Succeeded, Cancelled:
		return c.keys.QueueDone(q, string(st)), nil // "{finished}-{id}"
	}
	return "", &drover.InputError{Field: "status", Value: string(st), Rule: "must be SCHEDULED, PENDING, RUNNING, RETRYING, SLEEPING, WAITING, SUCCEEDED, DEAD or CANCELLED"}
}

// idOfIndexKey returns the task id of key in the index of status st.
func idOfIndexKey(st Status, key, prefix string) string {
	switch st {
	case Pending:
		return pendingID(key, prefix)
	case Retrying, Sleeping, Waiting, Succeeded, Cancelled: // "{time}-{id}"
		_, id, _ := keyspace.ParseTimedKey(prefix, key)
		return id
	}
	id, _ := keyspace.Last(prefix, key)
	return id
}

// checkCursor refuses a cursor that no listing gave: cursors are key
// suffixes, made of the characters of names, '/' and '-'.
func checkCursor(after string) error {
	if len(after) > maxCursor {
		return &drover.InputError{Field: "after", Value: after, Rule: "must be a cursor a listing gave (its next)"}
	}
	for i := 0; i < len(after); i++ {
		ch := after[i]
		if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' || ch >= '0' && ch <= '9' || strings.IndexByte("._:-/", ch) >= 0) {
			return &drover.InputError{Field: "after", Value: after, Rule: "must be a cursor a listing gave (its next)"}
		}
	}
	return nil
}

// Stats counts queue q's tasks by status.
type Stats struct {
	Pending   int64 `json:"pending"`
	Running   int64 `json:"running"`
	Retrying  int64 `json:"retrying"`
	Succeeded int64 `json:"succeeded"`
	Dead      int64 `json:"dead"`
	Cancelled int64 `json:"cancelled"`
	// Scheduled counts the tasks submitted to run later whose time has
	// not come.
	Scheduled int64 `json:"scheduled"`
	// Paused: the queue is paused (Client.Pause); no claim of its tasks
	// commits until it is resumed.
	Paused bool `json:"paused"`
	// Sleeping counts the step tasks parked until their sleep ends.
	Sleeping int64 `json:"sleeping"`
	// Waiting counts the step tasks parked until a signal they wait for
	// comes or their wait times out.
	Waiting int64 `json:"waiting"`
}

// Total is the sum of every count.
func (s Stats) Total() int64 {
	return s.Scheduled + s.Pending + s.Running + s.Retrying + s.Sleeping + s.Waiting + s.Succeeded + s.Dead + s.Cancelled
}

// ByState is the counts by state in lower case, as the metrics label them.
func (s Stats) ByState() map[string]int64 {
	return map[string]int64{"scheduled": s.Scheduled, "pending": s.Pending, "running": s.Running, "retrying": s.Retrying,
		"sleeping": s.Sleeping, "waiting": s.Waiting, "succeeded": s.Succeeded, "dead": s.Dead, "cancelled": s.Cancelled}
}

// Unfinished counts tasks that are scheduled, pending, running, retrying,
// sleeping or waiting.
func (s Stats) Unfinished() int64 {
	return s.Scheduled + s.Pending + s.Running + s.Retrying + s.Sleeping + s.Waiting
}

// Stats counts queue q's tasks by status, in one read transaction.
func (c *Client) Stats(ctx context.Context, q string) (Stats, error) {
	if err := CheckQueue(q); err != nil {
		return Stats{}, err
	}
	count := func(p string) clientv3.Op { return clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly()) }
	// One read: a task moves from its segment to a record of its own in
	// one transaction, and two reads could see it in neither place.
	ops := []clientv3.Op{
		count(c.keys.QueuePending(q)), count(c.keys.QueueClaims(q)), count(c.keys.QueueRetry(q)),
		count(c.keys.QueueDone(q, string(Succeeded))), count(c.keys.QueueDead(q)), count(c.keys.QueueDone(q, string(Cancelled))),
		clientv3.OpGet(c.keys.QueueArchived(q)), clientv3.OpGet(c.keys.QueuePaused(q), clientv3.WithCountOnly()), count(c.keys.QueueSleep(q)),
		count(c.keys.QueueWait(q)),
	}
	// The due index is read only when it changed since the last Stats
	// (dueStats): with a million tasks scheduled it is hundreds of
	// thousands of keys.
	ops = append(ops, c.segmentStatsOps(q)...)
	resp, err := c.cli.Txn(ctx).If(c.dueUnchanged(q)).Then(ops...).Else(append(ops, c.dueRead(q))...).Commit()
	if err != nil {
		return Stats{}, fmt.Errorf("queue: stats of %s: %w", q, err)
	}
	n := func(i int) int64 { return resp.Responses[i].GetResponseRange().Count }
	var arch archived
	if kvs := resp.Responses[6].GetResponseRange().Kvs; len(kvs) > 0 {
		_ = json.Unmarshal(kvs[0].Value, &arch)
	}
	scheduled, pending, running, succeeded, err := c.segmentStats(ctx, q, resp.Succeeded, resp.Responses[len(ops)-len(c.segmentStatsOps(q)):])
	if err != nil {
		return Stats{}, err
	}
	return Stats{Scheduled: scheduled, Pending: n(0) - n(1) + pending, Running: n(1) + running, Retrying: n(2), Succeeded: n(3) + arch.Succeeded + succeeded + arch.SegmentSucceeded,
		Dead: n(4), Cancelled: n(5) + arch.Cancelled, Paused: n(7) > 0, Sleeping: n(8), Waiting: n(9)}, nil
}

// Terminal reports whether st is a final status: SUCCEEDED, DEAD or
// CANCELLED.
func (st Status) Terminal() bool { return st == Succeeded || st == Dead || st == Cancelled }
