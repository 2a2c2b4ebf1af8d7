package queue

import (
	"encoding/json"
	"errors"
	"log/slog"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A step task that sleeps (a step ended with task.Sleep or task.SleepUntil,
// or an exec step asked for a sleep) is parked: its outcome, fenced by its
// claim as any other, gives the claim up and puts the task on its queue's
// sleep index, queues/{q}/sleep/{due}-{id}, one key per task as a retry's,
// holding where the task goes back to. The same due.Index code that moves
// retries moves it back to pending when it falls due, on the mover's
// clock, and any worker claims it then. The attempt does not count, and
// the step's checkpoint was written, fenced by the claim, before the
// outcome: a worker that dies between the two leaves a task whose next
// attempt finds the checkpoint asleep and parks it again, running nothing.

// parked is the error a step handler returns for a task that sleeps until
// until: its steps' checkpoint is written and says so.
type parked struct{ until time.Time }

func (p *parked) Error() string {
	return "the task sleeps until " + p.until.Format(time.RFC3339Nano)
}

// sleepOf returns when the task a handler ran sleeps until: the handler
// returned a parked (a step task) or a task.SleepRequest (a handler that
// asks to run again later, its attempt not counted). A request that is
// not valid input is an error, permanent.
func sleepOf(err error, now time.Time) (until time.Time, ok bool, bad error) {
	var p *parked
	if errors.As(err, &p) {
		return p.until, true, nil
	}
	var r *task.SleepRequest
	if !errors.As(err, &r) {
		return time.Time{}, false, nil
	}
	until, err = r.Due(now)
	if err != nil {
		return time.Time{}, false, Permanent(err)
	}
	return until, true, nil
}

// asleep returns the outcome of a handler whose error *err asks for a
// sleep; a sleep asked for that is not valid input makes *err permanent.
func (w *Worker) asleep(c *claim, err *error) (outcome, bool) {
	until, ok, bad := sleepOf(*err, w.client.now())
	if bad != nil {
		*err = bad
	}
	return outcome{c: c, kind: Sleeping, until: until}, ok
}

// sleepKey is the task's key in its queue's sleep index.
func (c *Client) sleepKey(t *Task) string {
	return due.Key(c.keys.QueueSleep(t.Queue), t.ScheduledAt, t.ID)
}

// waitKey is the key of task t in the index it waits in when it is not
// pending: its sleep key when its record says SLEEPING, else its retry key.
func (c *Client) waitKey(t *Task) string {
	if t.CurrentStatus == Sleeping {
		return c.sleepKey(t)
	}
	return c.retryKey(t)
}

// sleepIndex is queue q's sleeping tasks as a due index: a task that falls
// due goes back to pending as a due retry does (the same value, the same
// writes), judged by the client's clock.
func (c *Client) sleepIndex(q string, logger *slog.Logger) *due.Index {
	ix := c.retryIndex(q, logger)
	ix.Prefix, ix.Now = c.keys.QueueSleep(q), c.now
	return ix
}

// sleepOps are the writes that park the task of outcome o until o.until:
// its record says SLEEPING, its attempt is given back, and its key in the
// sleep index says where it goes back to. ops are the writes recordOps
// made before (the claim's deletion).
func (w *Worker) sleepOps(o outcome, pendingKey string, seg bool, now time.Time, ops []clientv3.Op) ([]clientv3.Op, int) {
	t := o.c.task
	t.Transitions = appendLost(t.Transitions, t.Attempt, o.c.claimedAt)
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Running, At: o.c.claimedAt, Attempt: t.Attempt, Worker: w.worker})
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Sleeping, At: now, Attempt: t.Attempt, Worker: w.worker,
		Error: "sleeps until " + o.until.UTC().Format(time.RFC3339Nano)})
	t.Attempt-- // a sleep is not an attempt
	t.CurrentStatus, t.ScheduledAt, t.Token = Sleeping, o.until.UTC(), o.c.token
	rv, _ := json.Marshal(retryValue{PendingKey: pendingKey, Attempts: t.Attempt})
	rec, _ := json.Marshal(t)
	if !seg {
		ops = append(ops, clientv3.OpDelete(pendingKey))
	}
	return append(ops, clientv3.OpPut(w.client.sleepKey(t), string(rv)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec))), len(rec) + 500
}
