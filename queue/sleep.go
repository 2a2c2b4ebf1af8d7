package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
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
// until: its steps' checkpoint is written and says so. again: no step
// ran, the checkpoint found was still asleep (a re-park).
type parked struct {
	until time.Time
	again bool
	// wait, when set, is what the task waits for (until is the wait's
	// due time): it parks WAITING rather than SLEEPING.
	wait *task.Wait
}

// reparkAfter is how soon at the earliest a task parked again goes back
// to pending: a mover whose clock is ahead of the claiming worker's by
// more than task.SleepMargin would otherwise move it back at once, again
// and again, until the worker's clock caught up.
const reparkAfter = 30 * time.Second

func (p *parked) Error() string {
	if p.wait != nil {
		return "the task " + waitText(p.wait)
	}
	return "the task sleeps until " + p.until.Format(time.RFC3339Nano)
}

// sleepOf returns when the task a handler ran sleeps until: the handler
// returned a parked (a step task) or a task.SleepRequest (a handler that
// asks to run again later, its attempt not counted). A request that is
// not valid input is an error, permanent.
func sleepOf(err error, now time.Time) (until time.Time, ok bool, bad error) {
	var p *parked
	if errors.As(err, &p) {
		if p.again {
			return maxTime(p.until, now.Add(reparkAfter)), true, nil
		}
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

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// isReparked reports whether a handler's error parks its task again
// without running a step.
func isReparked(err error) bool {
	var p *parked
	return errors.As(err, &p) && p.again
}

// isSleep reports whether a handler's error asks for a sleep.
func isSleep(err error) bool {
	var p *parked
	var r *task.SleepRequest
	return err != nil && (errors.As(err, &p) || errors.As(err, &r))
}

// asleep returns the outcome of a handler whose error *err asks for a
// sleep; a sleep asked for that is not valid input makes *err permanent.
func (w *Worker) asleep(c *claim, err *error) (outcome, bool) {
	until, ok, bad := sleepOf(*err, w.client.now())
	if bad != nil {
		*err = bad
	}
	o := outcome{c: c, kind: Sleeping, until: until, repark: isReparked(*err)}
	var p *parked
	if ok && errors.As(*err, &p) && p.wait != nil {
		o.kind, o.wait = Waiting, p.wait
	}
	return o, ok
}

// sleepKey is the task's key in its queue's sleep index.
func (c *Client) sleepKey(t *Task) string {
	return due.Key(c.keys.QueueSleep(t.Queue), t.ScheduledAt, t.ID)
}

// waitKey is the key of task t in the index it waits in when it is not
// pending: its sleep key when its record says SLEEPING, its wait key when
// it says WAITING, else its retry key.
func (c *Client) waitKey(t *Task) string {
	switch t.CurrentStatus {
	case Sleeping:
		return c.sleepKey(t)
	case Waiting:
		return c.waitingKey(t)
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
// made before (the claim's deletion). A re-park of a task whose history
// shows it asleep adds no transitions: it ran nothing.
func (w *Worker) sleepOps(o outcome, pendingKey string, seg bool, now time.Time, ops []clientv3.Op) ([]clientv3.Op, int) {
	t := o.c.task
	t.Transitions = appendLost(t.Transitions, t.Attempt, o.c.claimedAt)
	if !o.repark || !sleptBefore(t) {
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Running, At: o.c.claimedAt, Attempt: t.Attempt, Worker: w.worker})
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Sleeping, At: now, Attempt: t.Attempt, Worker: w.worker,
			Error: "sleeps until " + o.until.UTC().Format(time.RFC3339Nano)})
	}
	t.Attempt-- // a sleep is not an attempt
	t.CurrentStatus, t.ScheduledAt, t.Token = Sleeping, o.until.UTC(), o.c.token
	rv, _ := json.Marshal(retryValue{PendingKey: pendingKey, Attempts: t.Attempt})
	rec, _ := json.Marshal(t)
	if !seg {
		ops = append(ops, clientv3.OpDelete(pendingKey))
	}
	return append(ops, clientv3.OpPut(w.client.sleepKey(t), string(rv)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec))), len(rec) + 500
}

// Exec steps. A process run by ExecHandler may end its run as a step that
// sleeps: it writes the sleep to the file $DROVER_SLEEP_FILE (a duration
// such as 10m or 90, in seconds, or an RFC 3339 time with its zone) and
// exits 0. What it printed is checkpointed as step $DROVER_STEP's state,
// fenced by the claim, and the task sleeps; when it falls due the command
// runs again as the next step, with that state in the file
// $DROVER_STATE_FILE (empty for step 1). A run that exits 0 without
// writing the sleep file ends the task as before, its output the result.

// execStep is one run of an exec handler's command as a step of its task.
type execStep struct {
	f    *claimFence // nil outside a worker: no steps
	dir  string
	cp   task.Checkpoint
	step int
}

// prepareExecStep finds which step of task t a run of an exec handler is:
// the step after its last checkpoint, always read (one Get): a run whose
// checkpoint committed may have been handed back, attempt uncounted and
// no sleep recorded, before its outcome was written. A checkpoint whose
// sleep ends within task.SleepMargin is waited out; one still further
// asleep returns a parked error: nothing runs.
func prepareExecStep(ctx context.Context, t *Task) (*execStep, error) {
	st := &execStep{step: 1}
	f, ok := ctx.Value(claimKey{}).(*claimFence)
	if !ok {
		return st, nil
	}
	st.f = f
	store, err := task.NewStore(f.w.cli, f.w.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	if st.cp, err = store.Load(ctx, t.ID); err != nil {
		return nil, err
	}
	if near, err := task.WaitNearSleep(ctx, st.cp.SleepUntil, f.w.client.now); err != nil {
		return nil, err
	} else if !near {
		return nil, &parked{until: st.cp.SleepUntil, again: true}
	}
	st.step = st.cp.Step + 1
	dir, err := os.MkdirTemp("", "drover-step-")
	if err != nil {
		return nil, fmt.Errorf("exec step: %w", err)
	}
	st.dir = dir
	if err := os.WriteFile(filepath.Join(dir, "state"), st.cp.State, 0o600); err != nil {
		st.cleanup()
		return nil, fmt.Errorf("exec step: %w", err)
	}
	return st, nil
}

// sleptBefore reports whether task t's history shows it asleep.
func sleptBefore(t *Task) bool {
	for _, tr := range t.Transitions {
		if tr.Status == Sleeping {
			return true
		}
	}
	return false
}

// env is what the command learns of its step.
func (st *execStep) env() []string {
	if st.dir == "" {
		return nil
	}
	return []string{"DROVER_STEP=" + strconv.Itoa(st.step), "DROVER_STATE_FILE=" + filepath.Join(st.dir, "state"),
		"DROVER_SLEEP_FILE=" + filepath.Join(st.dir, "sleep")}
}

func (st *execStep) cleanup() {
	if st.dir != "" {
		_ = os.RemoveAll(st.dir)
	}
}

// finish ends a run that exited 0 with output out: the task's result, or,
// when the command wrote a sleep, the step's checkpoint and a parked error.
func (st *execStep) finish(ctx context.Context, t *Task, out []byte) ([]byte, error) {
	if st.dir == "" {
		return out, nil
	}
	b, err := st.readSleep()
	if err != nil {
		return nil, Permanent(err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return out, nil
	}
	if len(out) > task.DefaultStateLimit {
		return nil, Permanent(fmt.Errorf("exec step %d printed %d bytes, over the %d-byte state limit of a step that sleeps", st.step, len(out), task.DefaultStateLimit))
	}
	req, err := task.ParseSleep("DROVER_SLEEP_FILE", string(b))
	if err != nil {
		return nil, Permanent(err)
	}
	w := st.f.w
	now := w.client.now()
	until, err := req.Due(now)
	if err != nil {
		return nil, Permanent(err)
	}
	store, err := task.NewStore(w.cli, w.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	at := time.Now().UTC()
	name := "step " + strconv.Itoa(st.step)
	next := task.Checkpoint{TaskID: t.ID, Step: st.step, StepName: name, State: out, SleepUntil: until, Worker: w.worker, Token: st.f.Token(), At: at}
	rec := task.StepRecord{Step: st.step, Name: name, Worker: w.worker, Token: st.f.Token(), StartedAt: at, FinishedAt: at}
	// The fence, not the handler's context, decides whether this write
	// counts: commit even if the context ended as the command exited.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := store.Commit(cctx, st.f, st.cp, &next, rec); err != nil {
		return nil, err
	}
	return nil, &parked{until: until}
}

// maxSleepFile bounds what is read of the sleep file.
const maxSleepFile = 1 << 10

// readSleep reads the sleep file the command wrote: nothing when there
// is none; an error when it is not a regular file (a link, a device) or
// holds more than maxSleepFile bytes.
func (st *execStep) readSleep() ([]byte, error) {
	name := filepath.Join(st.dir, "sleep")
	fi, err := os.Lstat(name)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("exec step %d: DROVER_SLEEP_FILE: %w", st.step, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("exec step %d: DROVER_SLEEP_FILE must be a regular file, not %s", st.step, fi.Mode().Type())
	}
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("exec step %d: DROVER_SLEEP_FILE: %w", st.step, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSleepFile+1))
	if err != nil {
		return nil, fmt.Errorf("exec step %d: DROVER_SLEEP_FILE: %w", st.step, err)
	}
	if len(b) > maxSleepFile {
		return nil, fmt.Errorf("exec step %d: DROVER_SLEEP_FILE must hold at most %d bytes (a duration or a time)", st.step, maxSleepFile)
	}
	return b, nil
}

// deferOps are the writes that hand the task of outcome o back to flow
// control: it goes back to pending after the delay, its attempt not
// charged. ops are the writes recordOps made before.
func (w *Worker) deferOps(o outcome, pendingKey string, seg bool, now time.Time, ops []clientv3.Op) ([]clientv3.Op, int) {
	t := o.c.task
	// Each deferral in a row doubles the delay (up to 16x, 30 s at
	// most), so a backlog held off by a quota or breaker does not keep
	// the claims busy; only the first one goes into the history.
	delay := min(o.delay<<min(t.Deferrals, 4), max(o.delay, 30*time.Second))
	if t.Deferrals == 0 {
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Pending, At: now, Attempt: t.Attempt, Worker: w.worker, Error: "deferred: " + o.deferred})
	}
	t.Deferrals++
	t.CurrentStatus, t.ScheduledAt = Pending, now.Add(delay)
	t.Attempt--
	rv, _ := json.Marshal(retryValue{PendingKey: pendingKey, Attempts: t.Attempt, Deferred: o.deferred})
	rec, _ := json.Marshal(t)
	if !seg {
		ops = append(ops, clientv3.OpDelete(pendingKey))
	}
	return append(ops, clientv3.OpPut(w.client.retryKey(t), string(rv)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec))), len(rec) + 500
}
