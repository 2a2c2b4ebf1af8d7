package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/queue"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// retryDelay is how long a tick that could not fire (the queue refused to
// store it, the previous task could not be read) or that overlap policy
// BufferOne holds waits before it tries again.
const retryDelay = time.Second

// EnvCrashAfterSubmit, set to N, makes a process that fires ticks kill
// itself (SIGKILL) right after submitting its Nth fire's task, before the
// move that records it: tests use it to show that the next mover submits
// the same task id, and that it counts once.
const EnvCrashAfterSubmit = "DROVER_TEST_SCHEDULE_CRASH_AFTER_SUBMIT"

// move is the due index's Move: it fires the tick the due item kv stands
// for, as the plan and the overlap policy say, and returns the writes that
// record it (the schedule's record with its next due item, a history
// record), which the index makes conditional on kv being as read. Between
// the submission and those writes a crash or a lost race leaves the item
// where it was, and the next mover submits the same task id again: a
// duplicate, stored once.
func (r *Runner) move(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
	c := r.Client
	ctx := r.ctx
	_, name, ok := due.Parse(c.keys.ScheduleDue(), string(kv.Key))
	if !ok {
		return nil, false
	}
	rec, _, err := c.read(ctx, name)
	switch {
	case errors.Is(err, ErrNotFound):
		return nil, false // deleted: its item goes too
	case errors.Is(err, errCorrupt):
		// Retrying cannot help, and an abort would fail the whole
		// batch: drop its item, once, and say so.
		r.logger().Error("schedule record does not read: its fires stop", "schedule", name, "err", err)
		return nil, false
	case err != nil:
		// etcd failing: the batch's request would fail too. Abort
		// it; the index reads again after a pause.
		r.logf("schedule %s: %v", name, err)
		return abort(kv), true
	case rec.Due != string(kv.Key) || rec.Spec.Paused:
		return nil, false // an item the record no longer points at
	}
	tm, err := rec.Spec.timing()
	if err != nil {
		return nil, false
	}
	now := c.now()
	p := decide(rec.Spec, tm, rec.Nominal, rec.Hold, now)
	if p.fire.IsZero() {
		c.aim(rec, p.next, false)
		return c.recordOps(rec), true
	}
	f := Fire{NominalTime: p.fire.UTC(), TaskID: TaskID(name, p.fire)}
	ok, err = r.overlap(ctx, rec, &f)
	if err != nil || !ok {
		if err != nil {
			r.logf("schedule %s: %v", name, err)
		}
		c.aimAt(rec, p.fire, now.Add(retryDelay), true) // held until it can fire
		return c.recordOps(rec), true
	}
	if f.Outcome == "" {
		f.SubmittedAt, f.Outcome, err = c.submit(ctx, &rec.Spec, f.TaskID)
		if err != nil {
			r.logf("schedule %s: %v", name, err)
			c.aimAt(rec, p.fire, now.Add(retryDelay), true)
			return c.recordOps(rec), true
		}
		r.crashHook()
		if f.Outcome == outSubmitted {
			rec.Last = f.TaskID
		}
	}
	c.aim(rec, p.next, false)
	hist := c.historyOp(rec, f) // counts it in rec: first
	return append(c.recordOps(rec), hist), true
}

// overlap applies the schedule's overlap policy before fire f: false holds
// the tick (BufferOne while the previous task runs); f.Outcome set to
// SKIPPED means the tick fires no task.
func (r *Runner) overlap(ctx context.Context, rec *record, f *Fire) (bool, error) {
	if rec.Spec.Overlap == Allow || rec.Last == "" {
		return true, nil
	}
	t, err := r.Client.queue.Get(ctx, rec.Last)
	if errors.Is(err, queue.ErrNotFound) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("read the previous fire's task %s: %w", rec.Last, err)
	}
	switch t.CurrentStatus {
	case queue.Succeeded, queue.Dead, queue.Cancelled:
		return true, nil
	}
	switch rec.Spec.Overlap {
	case BufferOne:
		return false, nil
	case CancelPrevious:
		if _, err := r.Client.queue.Cancel(ctx, rec.Last); err != nil && !errors.Is(err, queue.ErrFinished) {
			return false, fmt.Errorf("cancel the previous fire's task %s: %w", rec.Last, err)
		}
		return true, nil
	default: // Skip
		f.Outcome = outSkipped
		return true, nil
	}
}

// recordOps writes rec and its new due item (the index deletes the old).
func (c *Client) recordOps(rec *record) []clientv3.Op {
	b, _ := json.Marshal(rec)
	return []clientv3.Op{clientv3.OpPut(c.keys.Schedule(rec.Spec.Name), string(b)), clientv3.OpPut(rec.Due, dueValue(rec))}
}

// abort makes the index's whole request fail, leaving kv where it is: etcd
// refuses a request that deletes and puts one key. The index reads again
// after a pause; no move is recorded that was not decided.
func abort(kv *mvccpb.KeyValue) []clientv3.Op {
	return []clientv3.Op{clientv3.OpPut(string(kv.Key), string(kv.Value))}
}

// crashHook kills the process after the Nth submission when
// EnvCrashAfterSubmit says so.
func (r *Runner) crashHook() {
	if r.crashAfter <= 0 {
		return
	}
	if r.fired.Add(1) == r.crashAfter {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
