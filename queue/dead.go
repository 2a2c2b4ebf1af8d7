package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/droverhq/drover"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Requeue moves dead tasks of queue q back to pending with a fresh retry
// budget; ids empty means every dead task. It returns how many moved.
// progress, if set, is called after each transaction with the number of
// tasks handled so far.
func (c *Client) Requeue(ctx context.Context, q string, ids []string, progress func(done int)) (int, error) {
	return c.bulk(ctx, q, Dead, ids, progress, func(t *Task) ([]clientv3.Op, int, string) {
		now := c.now().UTC()
		t.CurrentStatus, t.RetriesAttempted, t.Attempt, t.Token = Pending, 0, 0, 0
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Pending, At: now, Error: "requeued from the dead-letter queue"})
		rec, _ := json.Marshal(t)
		return []clientv3.Op{clientv3.OpDelete(c.keys.QueueDead(q) + t.ID), clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)), clientv3.OpPut(c.pendingKey(t), encodePending(0, false))},
			len(rec), c.levelKey(q, levelOf(t.Metadata.Priority))
	})
}

// Purge deletes tasks of queue q in status st for good: their records, their
// checkpoints and their index keys. ids empty means every task in that
// status. A running task cannot be purged: cancel it first. It returns how
// many went; progress, if set, is called after each transaction with the
// number of tasks handled so far.
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
	n, err := c.bulk(ctx, q, st, ids, progressFrom(whole, progress), func(t *Task) ([]clientv3.Op, int, string) {
		ops := []clientv3.Op{clientv3.OpDelete(c.keys.Task(t.ID), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.TaskIndex(t.ID))}
		if t.seg != nil {
			exit := c.keys.Exit(q, t.seg.seg, t.seg.slot)
			if st == Succeeded {
				exit = c.keys.ExitDone(q, t.seg.seg, t.seg.slot)
			}
			return append(ops, clientv3.OpPut(exit, "purged")), 0, ""
		}
		switch st {
		case Pending:
			ops = append(ops, clientv3.OpDelete(c.pendingKey(t)))
		case Retrying:
			ops = append(ops, clientv3.OpDelete(c.retryKey(t)), clientv3.OpDelete(c.pendingKey(t)))
		case Dead:
			ops = append(ops, clientv3.OpDelete(c.keys.QueueDead(q)+t.ID))
		case Succeeded, Cancelled:
			ops = append(ops, clientv3.OpDelete(c.doneKey(q, st, t.finishedAt(), t.ID)))
		}
		return ops, 0, ""
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

// CancelTasks cancels tasks of queue q that are PENDING or RETRYING (ids, or
// every one in status st when ids is empty): each leaves its index and its
// record says CANCELLED. Running tasks are cancelled one at a time with
// Cancel. It returns how many were cancelled; progress, if set, is called
// after each transaction with the number handled so far.
func (c *Client) CancelTasks(ctx context.Context, q string, st Status, ids []string, progress func(done int)) (int, error) {
	if st != Pending && st != Retrying {
		return 0, &drover.InputError{Field: "status", Value: string(st), Rule: "must be PENDING or RETRYING: cancel a running task by its id"}
	}
	return c.bulk(ctx, q, st, ids, progress, func(t *Task) ([]clientv3.Op, int, string) {
		ops := c.cancelOps(t)
		return ops, len(ops[0].ValueBytes()), ""
	})
}

// cancelOps are the writes that cancel t; the first rewrites its record.
// A running task's claim goes too.
func (c *Client) cancelOps(t *Task) []clientv3.Op {
	now := c.now().UTC()
	t.CurrentStatus = Cancelled
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Cancelled, At: now, Attempt: t.Attempt})
	rec, _ := json.Marshal(t)
	if t.seg != nil { // the task leaves its segment for a record of its own
		return []clientv3.Op{
			clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)),
			clientv3.OpPut(c.keys.Exit(t.Queue, t.seg.seg, t.seg.slot), "cancelled"),
			clientv3.OpPut(c.doneKey(t.Queue, Cancelled, now, t.ID), ""),
		}
	}
	return []clientv3.Op{
		clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)),
		clientv3.OpDelete(c.pendingKey(t)),
		clientv3.OpDelete(c.retryKey(t)),
		clientv3.OpDelete(c.keys.QueueClaim(t.Queue, t.ID)),
		clientv3.OpPut(c.doneKey(t.Queue, Cancelled, now, t.ID), ""),
	}
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
