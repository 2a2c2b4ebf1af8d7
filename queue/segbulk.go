package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// segmentUnchanged are the compares that hold while t, a task in a segment,
// is as it was read in status st: the slot has not exited, the task has no
// record of its own, and, for a pending or running task, no run was made
// and no outcome written in its segment since (the caller reads again when
// another task's did).
func (c *Client) segmentUnchanged(t *Task, st Status) []clientv3.Cmp {
	at := t.seg
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(c.keys.Exit(at.queue, at.seg, at.slot)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.ExitDone(at.queue, at.seg, at.slot)), "=", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.TaskRecord(t.ID)), "=", 0),
	}
	if st == Pending || st == Running || st == Scheduled { // a scheduled one may fall due since
		cmps = append(cmps,
			clientv3.Compare(clientv3.ModRevision(c.keys.Runs(at.queue, at.seg)).WithPrefix(), "<", at.rev+1),
			clientv3.Compare(clientv3.ModRevision(c.keys.Outs(at.queue, at.seg)).WithPrefix(), "<", at.rev+1))
	}
	return cmps
}

// removeExpiredSegments removes queue q's segments closed before cutoff
// (Unix nanoseconds): the records, outcomes and exits, the index keys and
// step checkpoints of the tasks that succeeded in them, and the closed
// key, whose count moves to the queue's archived counts in the same
// transaction (unless archive is false: a purge). Tasks that left a
// segment keep their records. It only deletes, apart from the archived
// counts, so that a purge works while etcd refuses writes that grow it. It
// returns how many tasks it removed.
func (c *Client) removeExpiredSegments(ctx context.Context, q string, cutoff int64, archive bool) (int, error) {
	pre := c.keys.SegmentsClosed(q)
	removed := 0
	for {
		g, err := c.cli.Txn(ctx).Then(
			clientv3.OpGet(pre, clientv3.WithRange(keyspace.TimeBound(pre, cutoff)), clientv3.WithLimit(1)),
			clientv3.OpGet(c.keys.QueueArchived(q)),
		).Commit()
		if err != nil {
			return removed, fmt.Errorf("queue: remove expired segments of %s: %w", q, err)
		}
		kvs := g.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			return removed, nil
		}
		closed := kvs[0]
		_, seg, _ := keyspace.ParseTimedKey(pre, string(closed.Key))
		var arch archived
		var archRev int64
		if a := g.Responses[1].GetResponseRange().Kvs; len(a) > 0 {
			_ = json.Unmarshal(a[0].Value, &arch)
			archRev = a[0].ModRevision
		}
		st, err := c.readState(ctx, q, seg)
		if err != nil {
			return removed, err
		}
		ts, err := c.segmentTasks(ctx, q, seg)
		if err != nil {
			return removed, err
		}
		var ids []string
		for slot := range ts {
			if _, ok := st.ok[slot]; ok && !st.exits[slot] {
				ids = append(ids, ts[slot].ID)
			}
		}
		// Step checkpoints first, a request at a time: harmless to
		// repeat, and too many for the request that removes the rest.
		for start := 0; start < len(ids); start += 100 {
			var ops []clientv3.Op
			for _, id := range ids[start:min(start+100, len(ids))] {
				ops = append(ops, clientv3.OpDelete(c.keys.Task(id), clientv3.WithPrefix()))
			}
			if _, err := c.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return removed, fmt.Errorf("queue: remove expired segments of %s: %w", q, err)
			}
		}
		n, _ := strconv.ParseInt(string(closed.Value), 10, 64)
		ops := []clientv3.Op{
			clientv3.OpDelete(string(closed.Key)), clientv3.OpDelete(c.keys.Segment(q, seg)),
			clientv3.OpDelete(c.keys.Outs(q, seg), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.Exits(q, seg), clientv3.WithPrefix()),
		}
		if archive {
			arch.SegmentSucceeded += n
			b, _ := json.Marshal(arch)
			ops = append(ops, clientv3.OpPut(c.keys.QueueArchived(q), string(b)))
		}
		for _, id := range ids {
			ops = append(ops, clientv3.OpDelete(c.keys.TaskIndex(id)))
		}
		resp, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(string(closed.Key)), "=", closed.ModRevision),
			clientv3.Compare(clientv3.ModRevision(c.keys.QueueArchived(q)), "=", archRev),
		).Then(ops...).Commit()
		if err != nil {
			return removed, fmt.Errorf("queue: remove expired segments of %s: %w", q, err)
		}
		if resp.Succeeded {
			removed += int(n)
		}
	}
}

// purgePendingSegments removes, with deletes only, the open segments of
// queue q in which nothing runs and nothing succeeded: their records, keys
// and the index keys of their pending tasks (tasks that moved to records of
// their own keep theirs). What it leaves (segments with successes or runs)
// the caller purges task by task. It returns how many tasks it removed.
func (c *Client) purgePendingSegments(ctx context.Context, q string, progress func(int)) (int, error) {
	removed := 0
	from := c.keys.SegmentsOpen(q)
	end := clientv3.GetPrefixRangeEnd(from)
	for {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(openRead))
		if err != nil {
			return removed, fmt.Errorf("queue: purge %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			seg, _ := keyspace.Last(c.keys.SegmentsOpen(q), string(kv.Key))
			n, err := c.purgeSegment(ctx, q, seg)
			if err != nil {
				return removed, err
			}
			removed += n
			if progress != nil && n > 0 {
				progress(removed)
			}
		}
		if !g.More || len(g.Kvs) == 0 {
			return removed, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// purgeSegment removes segment seg of queue q if nothing runs or succeeded
// in it, and returns how many pending tasks went with it.
func (c *Client) purgeSegment(ctx context.Context, q, seg string) (int, error) {
	st, err := c.readState(ctx, q, seg)
	if err != nil {
		return 0, err
	}
	if !st.open || len(st.runs) > 0 || len(st.ok) > 0 {
		return 0, nil
	}
	ts, err := c.segmentTasks(ctx, q, seg)
	if err != nil || ts == nil {
		return 0, err
	}
	ops := []clientv3.Op{
		clientv3.OpDelete(c.keys.Segment(q, seg)), clientv3.OpDelete(c.keys.SegmentOpen(q, seg)),
		clientv3.OpDelete(c.keys.Tries(q, seg), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.Outs(q, seg), clientv3.WithPrefix()),
		clientv3.OpDelete(c.keys.Exits(q, seg), clientv3.WithPrefix()),
	}
	n := 0
	for slot := range ts {
		if !st.finished(slot) {
			ops = append(ops, clientv3.OpDelete(c.keys.TaskIndex(ts[slot].ID)), clientv3.OpDelete(c.keys.Task(ts[slot].ID), clientv3.WithPrefix()))
			n++
		}
	}
	if len(ops) > 120 { // two deletes a task: in two requests, the index keys last
		return c.purgeSegmentInTwo(ctx, q, st, ts, ops)
	}
	resp, err := c.cli.Txn(ctx).If(c.segmentIdle(q, st)...).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	if !resp.Succeeded {
		return 0, nil // claimed or changed since the read: purged task by task
	}
	return n, nil
}

// segmentIdle are the compares that hold while segment st is as read: open,
// no run, no outcome or exit since.
func (c *Client) segmentIdle(q string, st *segState) []clientv3.Cmp {
	return []clientv3.Cmp{
		clientv3.Compare(clientv3.CreateRevision(c.keys.SegmentOpen(q, st.name)), ">", 0),
		clientv3.Compare(clientv3.CreateRevision(c.keys.Runs(q, st.name)).WithPrefix(), "=", 0),
		clientv3.Compare(clientv3.ModRevision(c.keys.Outs(q, st.name)).WithPrefix(), "<", st.rev+1),
		clientv3.Compare(clientv3.ModRevision(c.keys.Exits(q, st.name)).WithPrefix(), "<", st.rev+1),
	}
}

// purgeSegmentInTwo is purgeSegment for a segment whose deletes do not fit
// one request: the segment and index keys under the compares, then the
// step checkpoints.
func (c *Client) purgeSegmentInTwo(ctx context.Context, q string, st *segState, ts []Task, ops []clientv3.Op) (int, error) {
	var first, rest []clientv3.Op
	for _, op := range ops {
		if op.IsDelete() && op.RangeBytes() != nil && strings.HasPrefix(string(op.KeyBytes()), c.keys.Tasks()) {
			first = append(first, op)
		} else {
			rest = append(rest, op)
		}
	}
	resp, err := c.cli.Txn(ctx).If(c.segmentIdle(q, st)...).Then(rest...).Commit()
	if err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	if !resp.Succeeded {
		return 0, nil
	}
	// The tasks are gone: their step checkpoints go after them (never
	// before, or a claim in between would run tasks without theirs).
	if _, err := c.cli.Txn(ctx).Then(first...).Commit(); err != nil {
		return 0, fmt.Errorf("queue: purge %s: %w", q, err)
	}
	return len(rest) - 5, nil
}
