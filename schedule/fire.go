package schedule

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
// BufferOne holds waits before it first tries again; each try after
// doubles the wait, up to the schedule's interval and maxRetryDelay.
const (
	retryDelay    = time.Second
	maxRetryDelay = time.Minute
)

// retry points rec's due item at tick nominal again, after its tries'
// backoff.
func (c *Client) retry(rec *record, tm timing, nominal time.Time, hold bool) {
	tries := 1
	if nominal.Equal(rec.Nominal) {
		tries = min(rec.Tries+1, 32)
	}
	c.aimAt(rec, nominal, c.now().Add(backoff(tries, tm.next(nominal).Sub(nominal))), hold)
	rec.Tries = tries
}

// backoff is the wait before try n (from 1) of a tick of a schedule whose
// ticks are interval apart.
func backoff(n int, interval time.Duration) time.Duration {
	ceiling := max(retryDelay, min(interval, maxRetryDelay))
	d := retryDelay
	for i := 1; i < n && d < ceiling; i++ {
		d *= 2
	}
	return min(d, ceiling)
}

// EnvCrashAfterSubmit, set to N, makes a process that fires ticks kill
// itself (SIGKILL) right after submitting the task of its Nth fire of its
// own namespace's schedules, before the move that records it: tests use
// it to show that the next mover submits the same task id, and that it
// counts once.
const EnvCrashAfterSubmit = "DROVER_TEST_SCHEDULE_CRASH_AFTER_SUBMIT"

// move is the due index's Move: it fires the tick the due item kv stands
// for, as the plan and the overlap policy say, and returns the writes that
// record it (the schedule's record with its next due item, a history
// record), which the index makes conditional on kv being as read.
//
// A tick that submits a task is first written down as the record's
// Pending, by a write fenced on the record and kv being as read; only then
// is the task submitted. A crash, or a change of the schedule, between the
// submission and the move leaves Pending in the record, and the next mover
// finishes that tick before any other: it submits the same task id again
// (a duplicate, stored once) and records it.
func (r *nsRunner) move(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
	c := r.c
	ctx := r.ctx
	_, name, ok := due.Parse(c.keys.ScheduleDue(), string(kv.Key))
	if !ok {
		return nil, false
	}
	rec, rev, err := c.read(ctx, name)
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
		return c.stopped(rec, err, r.logger()), true
	}
	if rec.Pending != nil {
		return r.finish(rec, tm)
	}
	now := c.now()
	p := decide(rec.Spec, tm, rec.Nominal, rec.Hold, now)
	var miss *Fire // the ticks the plan passes over
	if n, first, last := p.missed(tm, rec.Nominal, rec.Hold); n > 0 {
		miss = &Fire{NominalTime: first.UTC(), LastTime: last.UTC(), Count: n, Outcome: outMissed}
	}
	if p.fire.IsZero() {
		c.aim(rec, p.next, false)
		return c.recordOps(rec, miss), true
	}
	f := Fire{NominalTime: p.fire.UTC(), TaskID: TaskID(name, p.fire)}
	ok, err = r.overlap(ctx, rec, &f)
	if err != nil || !ok {
		if err != nil {
			r.logf("schedule %s: %v", name, err)
		}
		if rec.Hold {
			miss = nil // held again: counted when it fires
		}
		c.retry(rec, tm, p.fire, true) // held until it can fire
		return c.recordOps(rec, miss), true
	}
	if f.Outcome == outSkipped {
		f.TaskID = "" // no task was submitted
		c.aim(rec, p.next, false)
		return c.recordOps(rec, miss, &f), true
	}
	rec.Pending = &pendingFire{Nominal: p.fire.UTC(), ID: f.TaskID, Next: p.next.UTC(), Missed: miss}
	if err := c.fence(ctx, rec, rev, kv); err != nil {
		if !errors.Is(err, errRaced) {
			r.logf("schedule %s: %v", name, err)
			return abort(kv), true
		}
		return nil, true // kv changed: this request's move of it fails
	}
	return r.finish(rec, tm)
}

// pendingFire is a tick whose task is (being) submitted and not yet
// recorded: ID is its task's id, Next the tick the schedule waits for
// after it.
type pendingFire struct {
	Nominal time.Time `json:"nominal"`
	ID      string    `json:"id"`
	Next    time.Time `json:"next"`
	// Missed is the record of the ticks passed over before it.
	Missed *Fire `json:"missed,omitempty"`
}

// errRaced: another mover or a change came first.
var errRaced = errors.New("schedule: raced")

// fence writes rec (its Pending) if its key is still at revision rev and
// the due item kv as read. When the record changed but kv did not
// (another mover wrote its Pending), it touches kv so that this request's
// move of it, and the other mover's, fail: the next mover finishes the
// other's tick.
func (c *Client) fence(ctx context.Context, rec *record, rev int64, kv *mvccpb.KeyValue) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	key, item := c.keys.Schedule(rec.Spec.Name), string(kv.Key)
	same := clientv3.Compare(clientv3.ModRevision(item), "=", kv.ModRevision)
	resp, err := c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", rev), same).
		Then(clientv3.OpPut(key, string(b))).
		Else(clientv3.OpTxn([]clientv3.Cmp{same}, []clientv3.Op{clientv3.OpPut(item, string(kv.Value))}, nil)).Commit()
	if err != nil {
		return fmt.Errorf("schedule: record the fire of %s: %w", rec.Spec.Name, err)
	}
	if !resp.Succeeded {
		return errRaced
	}
	return nil
}

// finish submits the task of rec's pending tick (again, if another mover
// did: a duplicate) and returns the writes that record it and point the
// due item at the tick after it. A failed submission keeps it pending.
func (r *nsRunner) finish(rec *record, tm timing) ([]clientv3.Op, bool) {
	c := r.c
	pf := rec.Pending
	f := Fire{NominalTime: pf.Nominal, TaskID: pf.ID}
	var err error
	f.SubmittedAt, f.Outcome, err = c.submit(r.ctx, &rec.Spec, pf.ID)
	if err != nil {
		r.logf("schedule %s: %v", rec.Spec.Name, err)
		c.retry(rec, tm, rec.Nominal, rec.Hold)
		return c.recordOps(rec), true // still pending
	}
	r.crashHook()
	if f.Outcome == outSubmitted {
		rec.Last = f.TaskID
	}
	if rec.Nominal.After(pf.Nominal) {
		// A change aimed the schedule past the pending tick: it
		// stands, due at once (kv is due, so the key differs).
		c.aimAt(rec, rec.Nominal, c.now().Add(time.Millisecond), rec.Hold)
	} else {
		c.aim(rec, pf.Next, false)
	}
	rec.Pending = nil
	return c.recordOps(rec, pf.Missed, &f), true
}

// overlap applies the schedule's overlap policy before fire f: false holds
// the tick (BufferOne while the previous task runs); f.Outcome set to
// SKIPPED means the tick fires no task.
func (r *nsRunner) overlap(ctx context.Context, rec *record, f *Fire) (bool, error) {
	if rec.Spec.Overlap == Allow || rec.Last == "" {
		return true, nil
	}
	t, err := r.c.queue.Get(ctx, rec.Last)
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
		if _, err := r.c.queue.Cancel(ctx, rec.Last); err != nil && !errors.Is(err, queue.ErrFinished) {
			return false, fmt.Errorf("cancel the previous fire's task %s: %w", rec.Last, err)
		}
		return true, nil
	default: // Skip
		f.Outcome = outSkipped
		return true, nil
	}
}

// stopped stops the fires of rec, whose timing no longer reads (a time
// zone gone from the zone database, say): its record waits on no due item,
// and its history and the log say why; an update that fixes it aims it
// again.
func (c *Client) stopped(rec *record, err error, log *slog.Logger) []clientv3.Op {
	log.Error("schedule timing does not read: its fires stop until it is updated", "schedule", rec.Spec.Name, "err", err)
	f := Fire{NominalTime: rec.Nominal.UTC(), Outcome: outStopped + ": " + err.Error()}
	rec.Due, rec.Hold = "", false
	hist := c.historyOp(rec, f)
	b, _ := json.Marshal(rec)
	return []clientv3.Op{clientv3.OpPut(c.keys.Schedule(rec.Spec.Name), string(b)), hist}
}

// recordOps writes rec and its new due item (the index deletes the old),
// and fires (nil ones left out) as its next history records.
func (c *Client) recordOps(rec *record, fires ...*Fire) []clientv3.Op {
	var hist []clientv3.Op
	for _, f := range fires {
		if f != nil {
			hist = append(hist, c.historyOp(rec, *f)) // counts it in rec: first
		}
	}
	b, _ := json.Marshal(rec)
	return append([]clientv3.Op{clientv3.OpPut(c.keys.Schedule(rec.Spec.Name), string(b)), clientv3.OpPut(rec.Due, dueValue(rec))}, hist...)
}

// abort makes the index's whole request fail, leaving kv where it is: etcd
// refuses a request that deletes and puts one key. The index reads again
// after a pause; no move is recorded that was not decided.
func abort(kv *mvccpb.KeyValue) []clientv3.Op {
	return []clientv3.Op{clientv3.OpPut(string(kv.Key), string(kv.Value))}
}

// crashHook kills the process after the Nth submission of its own
// namespace's schedules (the Runner's Client's; a server fires the other
// namespaces' too, which tests in parallel create) when
// EnvCrashAfterSubmit says so.
func (r *nsRunner) crashHook() {
	if r.afterSubmit != nil {
		r.afterSubmit()
	}
	if r.crashAfter > 0 && r.c.keys == r.Client.keys && r.fired.Add(1) == r.crashAfter {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}
