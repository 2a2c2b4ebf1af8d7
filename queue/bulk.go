package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrWrongStatus: a task named for a bulk change is not in the queue and
// status the change is for.
var ErrWrongStatus = errors.New("queue: task is not in that status")

// bulkChange returns the writes that change one task, an estimate of their
// size beyond the fixed cost of a few keys, and a key to put once in the
// request ("" for none: a priority level's marker, which several tasks of
// one request may share, and etcd refuses a request that writes a key
// twice).
type bulkChange func(t *Task) (ops []clientv3.Op, size int, shared string)

// bulk applies change to tasks of queue q in status st: the tasks ids name,
// or every task in that status when ids is empty. Tasks are read readBatch
// at a time and changed in one transaction per batch (fewer when the writes
// are large), each task in a nested transaction that applies only while
// the task is as it was read: record unchanged, still in its index, and for
// a pending task not claimed since. A task that changed in between is left
// as it is (not counted). A named task in another queue or status stops the
// change with an error, after the tasks before it.
func (c *Client) bulk(ctx context.Context, q string, st Status, ids []string, progress func(int), change bulkChange) (int, error) {
	if err := CheckQueue(q); err != nil {
		return 0, err
	}
	prefix, err := c.statusPrefix(q, st)
	if err != nil {
		return 0, err
	}
	for _, id := range ids {
		if err := keyspace.CheckName("task id", id); err != nil {
			return 0, err
		}
	}
	ids = slices.Clone(ids)
	slices.Sort(ids)
	ids = slices.Compact(ids)
	named := len(ids) > 0
	n, done := 0, 0
	var cursor, segCursor string
	if st == Scheduled {
		cursor = "end" // only segments: the due index names segments, not tasks
	}
	segments := true // the segments are still to be walked
	for {
		var batch []string
		var tasks []*Task
		switch {
		case named:
			batch, ids = ids[:min(readBatch, len(ids))], ids[min(readBatch, len(ids)):]
		case cursor != "end":
			if batch, cursor, err = c.indexPage(ctx, prefix, st, cursor); err != nil {
				return n, err
			}
		case segments && segmentStatus(st):
			// Then the tasks in segments, a page at a time.
			if tasks, segCursor, err = c.listSegments(ctx, q, st, segCursor, readBatch); err != nil {
				return n, err
			}
			segments = segCursor != ""
			for _, t := range tasks {
				batch = append(batch, t.ID)
			}
		}
		if len(batch) == 0 {
			if !named && cursor == "end" && segments && segmentStatus(st) {
				continue // the index is done: on to the segments
			}
			return n, nil
		}
		if tasks == nil {
			if tasks, err = c.getMany(ctx, batch); err != nil {
				return n, err
			}
		}
		if named && len(tasks) < len(batch) {
			return n, fmt.Errorf("%w: %s", ErrNotFound, missing(batch, tasks))
		}
		var todo []*Task
		for _, t := range tasks {
			if t.Queue == q && t.CurrentStatus == st {
				todo = append(todo, t)
			} else if named {
				return n, errNotIn(t, q, st)
			}
		}
		k, err := c.applyBulk(ctx, st, todo, change)
		n += k
		if err != nil {
			return n, err
		}
		if done += len(batch); progress != nil {
			progress(done)
		}
	}
}

// indexPage returns the next ids of index prefix after cursor, and the
// cursor after them ("end" when the index has no more).
func (c *Client) indexPage(ctx context.Context, prefix string, st Status, cursor string) ([]string, string, error) {
	from := prefix
	if cursor != "" {
		from = prefix + cursor + "\x00"
	}
	g, err := c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(prefix)), clientv3.WithKeysOnly(), clientv3.WithLimit(readBatch))
	if err != nil {
		return nil, "", fmt.Errorf("queue: read %s: %w", prefix, err)
	}
	ids := make([]string, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		ids = append(ids, idOfIndexKey(st, string(kv.Key), prefix))
		cursor = keyspace.Rest(prefix, string(kv.Key))
	}
	if !g.More {
		cursor = "end"
	}
	return ids, cursor, nil
}

// applyBulk writes change for tasks, in requests that stay within etcd's
// operation and size limits, and returns how many applied.
func (c *Client) applyBulk(ctx context.Context, st Status, tasks []*Task, change bulkChange) (int, error) {
	n := 0
	for try := 0; len(tasks) > 0; try++ {
		k, missed, err := c.applyOnce(ctx, st, tasks, change)
		if n += k; err != nil {
			return n, err
		}
		// A task in a segment is refused when a neighbour in it was
		// claimed or finished since the read: read such tasks again,
		// and change those still in status st, a few times.
		var again []string
		for _, t := range missed {
			if t.seg != nil {
				again = append(again, t.ID)
			}
		}
		if len(again) == 0 || try == 10 {
			return n, nil
		}
		fresh, err := c.getMany(ctx, again)
		if err != nil {
			return n, err
		}
		tasks = nil
		for _, t := range fresh {
			if t.CurrentStatus == st {
				tasks = append(tasks, t)
			}
		}
	}
	return n, nil
}

// applyOnce is one pass of applyBulk: it returns how many changes applied
// and the tasks whose change did not (they changed since they were read).
func (c *Client) applyOnce(ctx context.Context, st Status, tasks []*Task, change bulkChange) (int, []*Task, error) {
	n, size := 0, 0
	var ops []clientv3.Op
	var sent, missed []*Task
	shared := map[string]bool{}
	send := func() error {
		if len(ops) == 0 {
			return nil
		}
		count := len(ops)
		for k := range shared {
			ops = append(ops, clientv3.OpPut(k, ""))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("queue: change %d tasks: %w", count, err)
		}
		for i, r := range resp.Responses[:count] {
			if r.GetResponseTxn().Succeeded {
				n++
			} else {
				missed = append(missed, sent[i])
			}
		}
		ops, sent, size = ops[:0], sent[:0], 0
		clear(shared)
		return nil
	}
	for _, t := range tasks {
		cmps := c.unchanged(t, st)
		writes, sz, key := change(t)
		if size+sz+1024 > maxRequestBytes {
			if err := send(); err != nil {
				return n, missed, err
			}
		}
		ops, sent = append(ops, clientv3.OpTxn(cmps, writes, nil)), append(sent, t)
		size += sz + 1024
		if key != "" {
			shared[key] = true
		}
	}
	return n, missed, send()
}

// unchanged are the compares that hold while t is as it was read in status
// st.
func (c *Client) unchanged(t *Task, st Status) []clientv3.Cmp {
	if t.seg != nil {
		return c.segmentUnchanged(t, st)
	}
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(c.keys.TaskRecord(t.ID)), "=", t.rev)}
	switch st {
	case Pending:
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.pendingKey(t)), "=", t.pendingRev),
			clientv3.Compare(clientv3.CreateRevision(c.keys.QueueClaim(t.Queue, t.ID)), "=", 0))
	case Retrying:
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.retryKey(t)), ">", 0))
	case Sleeping:
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.sleepKey(t)), ">", 0))
	case Waiting:
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.waitingKey(t)), ">", 0))
	case Dead:
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.keys.DeadTask(t.Queue, t.ID)), ">", 0))
	}
	return cmps
}

// missing returns the first of ids that has no task.
func missing(ids []string, tasks []*Task) string {
	found := make(map[string]bool, len(tasks))
	for _, t := range tasks {
		found[t.ID] = true
	}
	for _, id := range ids {
		if !found[id] {
			return id
		}
	}
	return ""
}

// Requeue moves dead tasks of queue q back to pending with a fresh retry
// budget; ids empty means every dead task. A task that had waited for a
// signal resumes at the wait its dead attempt was claimed after, as a
// retry does (Outcome.Received). It returns how many moved.
// progress, if set, is called after each transaction with the number of
// tasks handled so far.
func (c *Client) Requeue(ctx context.Context, q string, ids []string, progress func(done int)) (int, error) {
	return c.bulk(ctx, q, Dead, ids, progress, func(t *Task) ([]clientv3.Op, int, string) {
		now := c.now().UTC()
		t.CurrentStatus, t.RetriesAttempted, t.Attempt, t.Token, t.StreamSettled = Pending, 0, 0, 0, false
		t.WaitingFor = t.resumes // its next claim resumes where the dead one did (Outcome.Received)
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Pending, At: now, Error: "requeued from the dead-letter queue"})
		rec, _ := json.Marshal(t)
		return []clientv3.Op{clientv3.OpDelete(c.keys.DeadTask(q, t.ID)), clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)), clientv3.OpPut(c.pendingKey(t), encodePending(0, false)),
				clientv3.OpDelete(c.keys.ChildSealed(t.ID))}, // it may spawn again

			len(rec), c.levelKey(q, levelOf(t.Metadata.Priority))
	})
}

// Purge deletes tasks of queue q in status st for good: their records, their
// checkpoints and their index keys. ids empty means every task in that
// status. A running task cannot be purged: cancel it first. A child that
// had not ended ends for its parent in the same transaction: CANCELLED,
// with the error "purged", and its parent's wake mark put. It returns how
// many went; progress, if set, is called after each transaction with the
// number of tasks handled so far. A DEAD or CANCELLED task whose cascade
// (the cancels of its live children) is not finished has it finished
// first: its plan, which names the children, goes with it.
func (c *Client) Purge(ctx context.Context, q string, st Status, ids []string, progress func(done int)) (int, error) {
	if st == Running {
		return 0, &drover.InputError{Field: "status", Value: string(st), Rule: "running tasks cannot be purged: cancel them first"}
	}
	whole := 0
	if st == Succeeded && len(ids) == 0 {
		// Finished segments go whole, with deletes only (this works while
		// etcd refuses writes that grow it); what is left below is in
		// open segments or has records.
		if _, err := c.closeFinished(ctx, q); err != nil {
			return 0, err
		}
		n, err := c.removeExpiredSegments(ctx, q, math.MaxInt64, false)
		if whole = n; err != nil {
			return n, err
		}
		if progress != nil && n > 0 {
			progress(n)
		}
	}
	if st == Pending && len(ids) == 0 {
		n, err := c.purgePendingSegments(ctx, q, progress)
		if whole = n; err != nil {
			return n, err
		}
	}
	if st == Scheduled && len(ids) == 0 {
		n, err := c.purgeScheduledSegments(ctx, q, progress)
		if whole = n; err != nil {
			return n, err
		}
	}
	if err := c.purgeCascades(ctx, q, st, ids); err != nil {
		return whole, err
	}
	n, err := c.bulk(ctx, q, st, ids, progressFrom(whole, progress), func(t *Task) ([]clientv3.Op, int, string) {
		ops := []clientv3.Op{clientv3.OpDelete(c.keys.Task(t.ID), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.TaskIndex(t.ID))}
		var wake string
		if !st.Terminal() {
			// A child that never ends would leave its parent waiting: its
			// purge is its end, CANCELLED for the parent.
			var done []clientv3.Op
			done, wake = c.childDoneOps(t, Cancelled, nil, "purged")
			ops = append(ops, done...)
		}
		if t.seg != nil {
			exit := c.keys.Exit(q, t.seg.seg, t.seg.slot)
			if st == Succeeded {
				exit = c.keys.ExitDone(q, t.seg.seg, t.seg.slot)
			}
			return append(ops, clientv3.OpPut(exit, "purged")), 0, wake
		}
		switch st {
		case Pending:
			ops = append(ops, clientv3.OpDelete(c.pendingKey(t)))
		case Retrying:
			ops = append(ops, clientv3.OpDelete(c.retryKey(t)), clientv3.OpDelete(c.pendingKey(t)))
		case Sleeping:
			ops = append(ops, clientv3.OpDelete(c.sleepKey(t)), clientv3.OpDelete(c.pendingKey(t)))
		case Waiting:
			ops = append(ops, clientv3.OpDelete(c.waitingKey(t)), clientv3.OpDelete(c.pendingKey(t)))
		case Dead:
			ops = append(ops, clientv3.OpDelete(c.keys.DeadTask(q, t.ID)))
		case Succeeded, Cancelled:
			ops = append(ops, clientv3.OpDelete(c.doneKey(q, st, t.finishedAt(), t.ID)))
		}
		return ops, 0, wake
	})
	return whole + n, err
}

// progressFrom returns progress, counting from base.
func progressFrom(base int, progress func(int)) func(int) {
	if progress == nil {
		return nil
	}
	return func(done int) { progress(base + done) }
}

// CancelTasks cancels tasks of queue q that are SCHEDULED, PENDING, RETRYING, SLEEPING or WAITING (ids, or
// every one in status st when ids is empty): each leaves its index and its
// record says CANCELLED. Running tasks are cancelled one at a time with
// Cancel. It returns how many were cancelled; progress, if set, is called
// after each transaction with the number handled so far.
func (c *Client) CancelTasks(ctx context.Context, q string, st Status, ids []string, progress func(done int)) (int, error) {
	if st != Pending && st != Retrying && st != Scheduled && st != Sleeping && st != Waiting {
		return 0, &drover.InputError{Field: "status", Value: string(st), Rule: "must be SCHEDULED, PENDING, RETRYING, SLEEPING or WAITING: cancel a running task by its id"}
	}
	var touched []*Task
	n, err := c.bulk(ctx, q, st, ids, progress, func(t *Task) ([]clientv3.Op, int, string) {
		touched = append(touched, t)
		t.StreamSettled = true // no done is written: a follower ends at once
		ops := append(c.cancelOps(t, false), c.cascadeMarkOp(t))
		return ops, len(ops[0].ValueBytes()), c.childWakeKey(t) // several children of one parent share it
	})
	if err != nil {
		return n, err
	}
	return n, c.afterCancels(ctx, touched)
}

// cancelOps are the writes that cancel t; the first rewrites its record.
// A running task's claim goes too. cascaded: the cancel is a parent's
// cascade (childCancelOps).
func (c *Client) cancelOps(t *Task, cascaded bool) []clientv3.Op {
	now := c.now().UTC()
	sleepKey, waitKey := c.sleepKey(t), c.waitingKey(t)
	t.CurrentStatus, t.WaitingFor = Cancelled, nil
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Cancelled, At: now, Attempt: t.Attempt})
	rec, _ := json.Marshal(t)
	if t.seg != nil { // the task leaves its segment for a record of its own
		return append([]clientv3.Op{
			clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)),
			clientv3.OpPut(c.keys.Exit(t.Queue, t.seg.seg, t.seg.slot), "cancelled"),
			clientv3.OpPut(c.doneKey(t.Queue, Cancelled, now, t.ID), ""),
		}, c.childCancelOps(t, cascaded)...)
	}
	return append([]clientv3.Op{
		clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)),
		clientv3.OpDelete(c.pendingKey(t)),
		clientv3.OpDelete(c.retryKey(t)),
		clientv3.OpDelete(sleepKey),
		clientv3.OpDelete(waitKey),
		clientv3.OpDelete(c.keys.QueueClaim(t.Queue, t.ID)),
		clientv3.OpPut(c.doneKey(t.Queue, Cancelled, now, t.ID), ""),
	}, c.childCancelOps(t, cascaded)...)
}

// finishedAt is when a finished task reached its terminal status: the time
// of its last transition, which is in its done key.
func (t *Task) finishedAt() (at time.Time) {
	if n := len(t.Transitions); n > 0 {
		return t.Transitions[n-1].At
	}
	return at
}

// errNotIn says a task named for a bulk change is not where it must be.
func errNotIn(t *Task, q string, st Status) error {
	if st == Dead {
		return fmt.Errorf("%w: %s is %s in queue %s", ErrNotDead, t.ID, t.CurrentStatus, t.Queue)
	}
	return fmt.Errorf("%w: %s is %s in queue %s, not %s in queue %s", ErrWrongStatus, t.ID, t.CurrentStatus, t.Queue, st, q)
}

// purgeCascades finishes, before a purge of queue q's tasks in status st
// (ids; all when empty), the cascades of those that left a cascade mark:
// the mark names its task's children through the task's plan, which the
// purge removes. Only DEAD and CANCELLED tasks have marks.
func (c *Client) purgeCascades(ctx context.Context, q string, st Status, ids []string) error {
	if st != Dead && st != Cancelled {
		return nil
	}
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	pre := c.keys.ChildCascades(q)
	for from := pre; ; {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(1000))
		if err != nil {
			return fmt.Errorf("queue: read the cancel cascades of %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			id := keyspace.Rest(pre, string(kv.Key))
			if len(want) > 0 && !want[id] {
				continue
			}
			cctx, stop := context.WithTimeout(ctx, cancelCascadeTimeout)
			err := c.cascade(cctx, q, id)
			stop()
			if err != nil {
				return fmt.Errorf("queue: purge %s: cancel the children of %s first: %w", q, id, err)
			}
		}
		if !g.More || len(g.Kvs) == 0 {
			return nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// cascadeFence is what a cascade's cancel of a child is made under: the
// record of the parent whose cascade it is, as the cascade read it.
type cascadeFence struct {
	parent string
	rev    int64 // the parent record's ModRevision
}

// errParentChanged says a cascade's parent changed since the cascade read
// it (a requeue): the cascade stops, its mark kept for a later reading.
var errParentChanged = errors.New("the parent changed since its cascade began")

// cancelBy cancels task id alone; by, when not nil, is the cascade of a
// parent the cancel is made for: it holds only while the parent's record
// is as the cascade read it (else errParentChanged), and it writes the
// child's done key without its failed mark, so that a parent requeued
// later does not fail of the children its own end cancelled. marked
// reports that the cancel put id's own cascade mark (id spawned
// children).
func (c *Client) cancelBy(ctx context.Context, id string, by *cascadeFence) (t *Task, marked bool, err error) {
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 { // a task in a busy segment: its neighbours change it
			sleepCtx(ctx, time.Duration(attempt)*5*time.Millisecond)
		}
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, false, err
		}
		switch t.CurrentStatus {
		case Succeeded, Dead, Cancelled:
			return t, false, fmt.Errorf("%w: task %s is %s", ErrFinished, id, t.CurrentStatus)
		}
		recKey := c.keys.TaskRecord(id)
		cmps := []clientv3.Cmp{
			clientv3.Compare(clientv3.ModRevision(recKey), "=", t.rev),
			clientv3.Compare(clientv3.ModRevision(c.pendingKey(t)), "=", t.pendingRev),
		}
		if t.seg != nil {
			cmps = c.segmentUnchanged(t, t.CurrentStatus)
		}
		if by != nil {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(c.keys.TaskRecord(by.parent)), "=", by.rev))
		}
		t.StreamSettled = false // its done follows the cancel (FinishStream)
		ops := c.cancelOps(t, by != nil)
		markAt := len(ops)
		ops = append(ops, c.cascadeMarkOp(t))
		if wake := c.childWakeKey(t); wake != "" {
			ops = append(ops, clientv3.OpPut(wake, ""))
		}
		if t.Token != 0 {
			l, err := c.cli.Grant(ctx, cancelSignalTTL)
			if err != nil {
				return nil, false, fmt.Errorf("queue: cancel %s: %w", id, err)
			}
			ops = append(ops, clientv3.OpPut(c.keys.CancelTask(t.Queue, id), "", clientv3.WithLease(l.ID)))
		}
		// Nothing may have changed since the read that decided all this:
		// not the record (an outcome rewrites it), not the pending key (a
		// claim rewrites it, and would then need the cancel signal).
		resp, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
		if err != nil {
			return nil, false, fmt.Errorf("queue: cancel %s: %w", id, err)
		}
		if resp.Succeeded {
			// Best effort: a follower of a stream left without its Done
			// ends through the task's status (stream.WhenEnded).
			_ = c.FinishStream(ctx, id, Cancelled, "")
			return t, resp.Responses[markAt].GetResponseTxn().Succeeded, nil
		}
		if by != nil {
			g, err := c.cli.Get(ctx, c.keys.TaskRecord(by.parent), clientv3.WithKeysOnly())
			if err != nil {
				return nil, false, fmt.Errorf("queue: cancel %s: read its parent: %w", id, err)
			}
			if len(g.Kvs) == 0 || g.Kvs[0].ModRevision != by.rev {
				return nil, false, fmt.Errorf("queue: cancel %s: %w", id, errParentChanged)
			}
		}
	}
	return nil, false, fmt.Errorf("queue: cancel %s: the task kept changing; try again", id)
}

// liveChildren returns the children of children (step step of task
// parent's plan) that are not detached and have no done key: none, after
// one count-only read, when every child of the step has one.
func (c *Client) liveChildren(ctx context.Context, parent string, step int, children []task.Child) ([]task.Child, error) {
	pre := c.keys.ChildDones(parent, step)
	n, err := c.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		return nil, fmt.Errorf("queue: count the ended children of %s: %w", parent, err)
	}
	done := map[string]bool{}
	if n.Count >= int64(len(children)) {
		return nil, nil
	}
	if n.Count > 0 {
		for key := pre; ; {
			g, err := c.cli.Get(ctx, key, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(1000))
			if err != nil {
				return nil, fmt.Errorf("queue: list the ended children of %s: %w", parent, err)
			}
			for _, kv := range g.Kvs {
				done[keyspace.Rest(pre, string(kv.Key))] = true
			}
			if !g.More || len(g.Kvs) == 0 {
				break
			}
			key = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
		}
	}
	var live []task.Child
	for _, ch := range children {
		if !ch.Detached && !done[ch.ID] {
			live = append(live, ch)
		}
	}
	return live, nil
}
