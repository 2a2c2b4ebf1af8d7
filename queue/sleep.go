package queue

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/droverhq/drover"
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
//
// It may end instead with a wait for a signal, written to
// $DROVER_WAIT_FILE ("approval", "approve,reject 24h": names, then a
// timeout), or by spawning children, written to $DROVER_SPAWN_FILE as
// JSON ({"children": [{"queue", "task_type", "parameters", "key",
// "priority", "max_retries", "timeout", "detached"}], "wait": N,
// "collect": bool}): the step is checkpointed with the wait or the
// children's plan, fenced by the claim, the children submitted, and the
// task parks WAITING exactly as a queue.Steps task does. The next step
// gets the signal's JSON in $DROVER_SIGNAL_FILE (and its name in
// $DROVER_SIGNAL_NAME), or the children's outcomes, a JSON array, in
// $DROVER_CHILDREN_FILE.

// execStep is one run of an exec handler's command as a step of its task.
type execStep struct {
	f    *claimFence // nil outside a worker: no steps
	dir  string
	cp   task.Checkpoint
	step int
	// sg is the signal the step resumes with (nil: none), children
	// whether it gets the outcomes of the children of the step before.
	sg       *task.Signal
	children bool
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
	if err := st.resume(ctx, store, t); err != nil {
		return nil, err
	}
	st.step = st.cp.Step + 1
	dir, err := os.MkdirTemp("", "drover-step-")
	if err != nil {
		return nil, fmt.Errorf("exec step: %w", err)
	}
	st.dir = dir
	if err := st.writeInputs(ctx, store, t.ID); err != nil {
		st.cleanup()
		return nil, err
	}
	return st, nil
}

// resume decides whether the step after st's checkpoint may run: the
// signal its wait waits for came (or the wait timed out), its children
// ended. Otherwise it returns a parked error: the task parks again.
func (st *execStep) resume(ctx context.Context, store *task.Store, t *Task) error {
	if wt := st.cp.Wait; wt != nil {
		sg, err := store.ClaimSignal(ctx, t.ID, wt, 0, st.f.w.client.now())
		if err != nil {
			return err
		}
		if sg == nil {
			return &parked{until: waitDue(wt), wait: wt, again: true}
		}
		st.sg = sg
	}
	if st.cp.Spawn != nil {
		p, err := st.awaitChildren(ctx, store, t, true)
		if err != nil {
			return err
		}
		if p != nil {
			return p
		}
		st.children = true
	}
	return nil
}

// awaitChildren submits the children of st's checkpoint if they are not
// yet and returns the park of a task that waits for them (nil: they
// ended). A child that failed its parent is a permanent error.
func (st *execStep) awaitChildren(ctx context.Context, store *task.Store, t *Task, again bool) (*parked, error) {
	w, err := store.AwaitChildren(ctx, st.f, childSpawner{c: st.f.w.client, q: st.f.w.cfg.Queue}, st.cp)
	var cf *task.ChildFailedError
	if errors.As(err, &cf) {
		return nil, Permanent(err)
	}
	if err != nil || w.Ready() {
		return nil, err
	}
	wt := &task.Wait{Since: st.cp.At, Children: &task.ChildrenWait{Step: st.cp.Step, N: w.N, Wait: w.Wait, Collect: w.Collect, Rev: w.Rev}}
	return &parked{until: waitDue(wt), wait: wt, again: again}, nil
}

// writeInputs writes the files the command reads: the state, the signal
// it resumes with, its children's outcomes.
func (st *execStep) writeInputs(ctx context.Context, store *task.Store, id string) error {
	if err := os.WriteFile(filepath.Join(st.dir, "state"), st.cp.State, 0o600); err != nil {
		return fmt.Errorf("exec step: %w", err)
	}
	if st.sg != nil {
		b, _ := json.Marshal(st.sg)
		if err := os.WriteFile(filepath.Join(st.dir, "signal"), b, 0o600); err != nil {
			return fmt.Errorf("exec step: %w", err)
		}
	}
	if !st.children {
		return nil
	}
	if err := writeChildren(ctx, store, id, st.cp.Step, filepath.Join(st.dir, "children")); err != nil {
		return fmt.Errorf("exec step: %w", err)
	}
	return nil
}

// writeChildren writes the outcomes of the children step step of task id
// spawned to path, a JSON array, a page at a time: however many there
// are, one page is in memory at once.
func writeChildren(ctx context.Context, store *task.Store, id string, step int, path string) (err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}()
	w := bufio.NewWriter(f)
	sep := "["
	for after := ""; ; {
		page, next, err := store.ChildrenOf(ctx, id, step, after, 500)
		if err != nil {
			return err
		}
		for i := range page {
			b, err := json.Marshal(&page[i])
			if err != nil {
				return err
			}
			_, _ = w.WriteString(sep)
			_, _ = w.Write(b)
			sep = ","
		}
		if next == "" {
			break
		}
		after = next
	}
	if sep == "[" {
		_, _ = w.WriteString("[")
	}
	_, _ = w.WriteString("]")
	return w.Flush()
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
	env := []string{"DROVER_STEP=" + strconv.Itoa(st.step), "DROVER_STATE_FILE=" + filepath.Join(st.dir, "state"),
		"DROVER_SLEEP_FILE=" + filepath.Join(st.dir, "sleep"), "DROVER_WAIT_FILE=" + filepath.Join(st.dir, "wait"),
		"DROVER_SPAWN_FILE=" + filepath.Join(st.dir, "spawn")}
	if st.sg != nil {
		env = append(env, "DROVER_SIGNAL_FILE="+filepath.Join(st.dir, "signal"), "DROVER_SIGNAL_NAME="+st.sg.Name)
	}
	if st.children {
		env = append(env, "DROVER_CHILDREN_FILE="+filepath.Join(st.dir, "children"))
	}
	return env
}

func (st *execStep) cleanup() {
	if st.dir != "" {
		_ = os.RemoveAll(st.dir)
	}
}

// finish ends a run that exited 0 with output out: the task's result, or,
// when the command wrote a sleep, a wait or a spawn, the step's checkpoint
// and a parked error.
func (st *execStep) finish(ctx context.Context, t *Task, out []byte) ([]byte, error) {
	if st.dir == "" {
		return out, nil
	}
	var ends [3][]byte
	for i, name := range []string{"sleep", "wait", "spawn"} {
		b, err := st.readFile(name)
		if err != nil {
			return nil, Permanent(err)
		}
		ends[i] = bytes.TrimSpace(b)
	}
	n := 0
	for _, b := range ends {
		if len(b) > 0 {
			n++
		}
	}
	switch {
	case n == 0:
		return out, nil
	case n > 1:
		return nil, Permanent(fmt.Errorf("exec step %d wrote more than one of DROVER_SLEEP_FILE, DROVER_WAIT_FILE and DROVER_SPAWN_FILE: a step ends with one", st.step))
	case len(out) > task.DefaultStateLimit:
		return nil, Permanent(fmt.Errorf("exec step %d printed %d bytes, over the %d-byte state limit of a step that sleeps, waits or spawns", st.step, len(out), task.DefaultStateLimit))
	}
	w := st.f.w
	store, err := task.NewStore(w.cli, w.cfg.Namespace)
	if err != nil {
		return nil, err
	}
	at := time.Now().UTC()
	name := "step " + strconv.Itoa(st.step)
	next := task.Checkpoint{TaskID: t.ID, Step: st.step, StepName: name, State: out, Worker: w.worker, Token: st.f.Token(), At: at}
	rec := task.StepRecord{Step: st.step, Name: name, Worker: w.worker, Token: st.f.Token(), StartedAt: at, FinishedAt: at}
	// The fence, not the handler's context, decides whether this write
	// counts: commit even if the context ended as the command exited.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	switch {
	case len(ends[0]) > 0:
		return nil, st.sleep(cctx, store, &next, rec, string(ends[0]))
	case len(ends[1]) > 0:
		return nil, st.wait(cctx, store, &next, rec, string(ends[1]))
	}
	return nil, st.spawn(cctx, store, t, &next, rec, ends[2])
}

// sleep checkpoints next with the sleep text asks for.
func (st *execStep) sleep(ctx context.Context, store *task.Store, next *task.Checkpoint, rec task.StepRecord, text string) error {
	req, err := task.ParseSleep("DROVER_SLEEP_FILE", text)
	if err != nil {
		return Permanent(err)
	}
	if next.SleepUntil, err = req.Due(st.f.w.client.now()); err != nil {
		return Permanent(err)
	}
	if err := store.CommitSignal(ctx, st.f, st.cp, next, rec, st.sg); err != nil {
		return err
	}
	return &parked{until: next.SleepUntil}
}

// wait checkpoints next with the wait text asks for ("NAME[,NAME...]
// [TIMEOUT]").
func (st *execStep) wait(ctx context.Context, store *task.Store, next *task.Checkpoint, rec task.StepRecord, text string) error {
	req, err := task.ParseWaitText("DROVER_WAIT_FILE", text)
	if err != nil {
		return Permanent(err)
	}
	next.Wait = req.Begin(st.f.w.client.now())
	if err := store.CommitSignal(ctx, st.f, st.cp, next, rec, st.sg); err != nil {
		return err
	}
	return &parked{until: waitDue(next.Wait), wait: next.Wait}
}

// fieldOf is the field an input error names ("" for another error).
func fieldOf(err error) string {
	var ie *drover.InputError
	if errors.As(err, &ie) {
		return ie.Field
	}
	return ""
}

// spawnFile is what an exec step writes to DROVER_SPAWN_FILE.
type spawnFile struct {
	Children []struct {
		task.Child
		Timeout string `json:"timeout,omitempty"`
	} `json:"children"`
	Wait    int  `json:"wait,omitempty"`
	Collect bool `json:"collect,omitempty"`
}

// spawn checkpoints next with the children b (the spawn file) lists,
// submits them and parks the task until enough of them ended.
func (st *execStep) spawn(ctx context.Context, store *task.Store, t *Task, next *task.Checkpoint, rec task.StepRecord, b []byte) error {
	var sf spawnFile
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sf); err != nil {
		return Permanent(&drover.InputError{Field: "DROVER_SPAWN_FILE", Rule: "must be JSON: {\"children\": [{\"queue\", \"task_type\", ...}], \"wait\", \"collect\"}: " + err.Error()})
	}
	req := &task.SpawnRequest{Children: make([]task.Child, len(sf.Children)), Options: task.SpawnOptions{Wait: sf.Wait, Collect: sf.Collect}}
	for i, c := range sf.Children {
		req.Children[i] = c.Child
		if c.Timeout != "" {
			sl, err := task.ParseSleep(fmt.Sprintf("DROVER_SPAWN_FILE children[%d].timeout", i), c.Timeout)
			if err != nil || sl.For <= 0 {
				return Permanent(&drover.InputError{Field: fmt.Sprintf("DROVER_SPAWN_FILE children[%d].timeout", i), Value: c.Timeout, Rule: "must be a positive duration such as 10m, or a number of seconds"})
			}
			req.Children[i].Timeout = sl.For
		}
	}
	err := store.CommitSpawn(ctx, st.f, childSpawner{c: st.f.w.client, q: st.f.w.cfg.Queue}, st.cp, next, rec, st.sg, req)
	if err != nil {
		if fieldOf(err) != "" {
			return Permanent(drover.Rename(err, "DROVER_SPAWN_FILE "+fieldOf(err)))
		}
		return err
	}
	if next.Spawn == nil { // no children: the next step runs at once
		return &parked{until: st.f.w.client.now()}
	}
	st.cp = *next
	p, err := st.awaitChildren(ctx, store, t, false)
	if err != nil {
		return err
	}
	if p == nil { // they ended already: run the next step at once
		return &parked{until: st.f.w.client.now()}
	}
	if beforeChildPark != nil {
		beforeChildPark(t.ID)
	}
	return p
}

// maxSleepFile bounds what is read of a sleep or wait file,
// maxSpawnFile of a spawn file.
const (
	maxSleepFile = 1 << 10
	maxSpawnFile = 64 << 20
)

// readFile reads the file name (sleep, wait, spawn) the command wrote:
// nothing when there is none; an error when it is not a regular file (a
// link, a device) or holds more than its bound (maxSleepFile; a spawn
// file maxSpawnFile).
func (st *execStep) readFile(file string) ([]byte, error) {
	name, env, limit := filepath.Join(st.dir, file), "DROVER_"+strings.ToUpper(file)+"_FILE", int64(maxSleepFile)
	if file == "spawn" {
		limit = maxSpawnFile
	}
	b, err := task.ReadStepFile(name, env, limit)
	if err != nil {
		return nil, fmt.Errorf("exec step %d: %w", st.step, err)
	}
	return b, nil
}

// retryValue is what a retry key holds: where the task goes back to.
type retryValue struct {
	PendingKey string `json:"p"`
	Attempts   int    `json:"a"`
	// Deferred is why flow control deferred the task, "" for a retry:
	// the queue's history counts the two apart from this key alone.
	Deferred string `json:"d,omitempty"`
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
