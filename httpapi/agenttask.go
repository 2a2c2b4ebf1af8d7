package httpapi

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// taskWhere maps the task package's input fields to request locations.
var taskWhere = map[string]string{"task id": "path.id", "state": "body.state"}

// taskStore is the task store of the request's namespace.
func (s *Server) taskStore(ctx context.Context) (*task.Store, error) {
	st, err := task.NewStore(s.cli, s.nsOf(ctx))
	if err != nil {
		return nil, problem(err, nil)
	}
	return st, nil
}

// taskProblem is problem for the task package's errors, with those it
// does not know itself.
func taskProblem(err error) error {
	switch {
	case errors.Is(err, task.ErrBusy):
		return newProblem(http.StatusConflict, "task-busy", err.Error()+"; claim again once it is done, or with ?wait")
	case errors.Is(err, task.ErrStepsChanged):
		return newProblem(http.StatusConflict, "conflict", err.Error())
	}
	return problem(err, taskWhere)
}

func agentTaskOf(cp task.Checkpoint) AgentTask {
	out := AgentTask{TaskID: cp.TaskID, Step: cp.Step, StepName: cp.StepName, Steps: cp.Steps, Completed: cp.Completed,
		State: cp.State, WrittenBy: cp.Worker, WrittenToken: cp.Token}
	if !cp.Completed {
		out.NextStep = cp.Step + 1
	}
	if cp.Completed && len(cp.State) > 0 && json.Valid(cp.State) {
		out.Result = json.RawMessage(cp.State)
	}
	if !cp.At.IsZero() {
		at := cp.At
		out.WrittenAt = &at
	}
	if !cp.Completed && !cp.SleepUntil.IsZero() {
		until := cp.SleepUntil
		out.SleepUntil = &until
	}
	if !cp.Completed && cp.Wait != nil {
		out.WaitingFor = taskWaitOfCheckpoint(cp.Wait)
	}
	if sp := cp.Spawn; !cp.Completed && sp != nil {
		out.WaitingFor = &TaskWait{Since: cp.At, Children: &TaskChildrenWait{Step: cp.Step, N: sp.N, Wait: sp.Wait, Collect: sp.Collect}}
	}
	return out
}

// taskWaitOfCheckpoint is a checkpoint's wait as the API shows it.
func taskWaitOfCheckpoint(w *task.Wait) *TaskWait {
	return taskWaitOf(&task.Wait{Signals: w.Signals, Since: w.Since, Until: w.Until})
}

// signalOf is sg as a claim answers it; nil for nil.
func signalOf(sg *task.Signal) *Signal {
	if sg == nil {
		return nil
	}
	out := &Signal{Name: sg.Name, Data: sg.Data, IdempotencyKey: sg.IdempotencyKey, TimedOut: sg.TimedOut}
	if !sg.SentAt.IsZero() {
		at := sg.SentAt
		out.SentAt = &at
	}
	return out
}

// stepWait reads the wait a step write ends with (nil: none), or a 400
// naming the field. last: nothing follows the step (no wait).
func stepWait(w *WaitSignalInput, sleeps, last bool, now time.Time) (*task.Wait, error) {
	if w == nil {
		return nil, nil
	}
	if sleeps {
		return nil, invalid("body.wait_signal", nil, "give a sleep (sleep_for, sleep_until) or wait_signal, not both")
	}
	req := &task.WaitRequest{Signals: w.Names}
	if w.Timeout != "" {
		sl, err := task.ParseSleep("body.wait_signal.timeout", w.Timeout)
		if err == nil && !sl.Until.IsZero() {
			err = &drover.InputError{Field: "body.wait_signal.timeout", Value: w.Timeout, Rule: "must be a duration such as 24h, or a number of seconds"}
		}
		if err != nil {
			return nil, problem(err, nil)
		}
		req.Timeout = sl.For
	}
	if err := req.Check(); err != nil {
		return nil, problem(err, map[string]string{"signal name": "body.wait_signal.names", "wait signals": "body.wait_signal.names", "wait timeout": "body.wait_signal.timeout"})
	}
	if last {
		return nil, nil
	}
	return req.Begin(now), nil
}

// stepSleep reads the sleep a step write ends with: when it ends (zero:
// no sleep), or a 400 naming the field. last: nothing follows the step.
func stepSleep(sleepFor, sleepUntil string, last bool) (time.Time, error) {
	until, err := parseSleep("body.", sleepFor, sleepUntil)
	if err != nil || last || !until.After(time.Now()) {
		return time.Time{}, err // nothing follows, or the time is past: no sleep
	}
	return until, nil
}

// parseSleep reads a sleep given as sleep_for or sleep_until (fields under
// prefix): when it ends, perhaps already past (zero: none given), or a 400
// naming the field.
func parseSleep(prefix, sleepFor, sleepUntil string) (time.Time, error) {
	field, value, rule := prefix+"sleep_for", sleepFor, "must be a duration such as 10m or 1.5s, or a number of seconds"
	switch {
	case sleepFor != "" && sleepUntil != "":
		return time.Time{}, invalid(prefix+"sleep_until", sleepUntil, "give sleep_for or sleep_until, not both")
	case sleepUntil != "":
		field, value, rule = prefix+"sleep_until", sleepUntil, "must be an RFC 3339 time with its zone, such as 2026-12-01T09:00:00Z"
	case sleepFor == "":
		return time.Time{}, nil
	}
	req, err := task.ParseSleep(field, value)
	if err == nil && req.Until.IsZero() != (value == sleepFor) {
		return time.Time{}, invalid(field, value, rule) // a time for a duration, or the other way round
	}
	var until time.Time
	if err == nil {
		until, err = req.Due(time.Now())
	}
	if err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) {
			ie.Field = field
		}
		return time.Time{}, problem(err, nil)
	}
	return until, nil
}

// checkClaim checks a claim's input, and returns how long it waits in
// line.
func (s *Server) checkClaim(in *claimTaskInput) (time.Duration, error) {
	if err := task.CheckID(in.ID); err != nil {
		return 0, problem(err, taskWhere)
	}
	wait, err := s.wait("query.wait", in.Wait)
	if err != nil {
		return 0, err
	}
	if _, _, _, ok := parseSessionID(in.Body.Session); !ok {
		return 0, invalid("body.session", in.Body.Session, sessionIDRule)
	}
	if tp := in.Body.TraceParent; tp != "" {
		if _, ok := otelspan.Parse(tp); !ok {
			return 0, invalid("body.traceparent", tp, "must be a W3C traceparent: 00-<32 hex digits>-<16 hex digits>-<2 hex digits>, in lower case")
		}
	}
	return wait, nil
}

func (s *Server) claimTask(ctx context.Context, in *claimTaskInput) (*struct{ Body AgentTaskClaim }, error) {
	wait, err := s.checkClaim(in)
	if err != nil {
		return nil, err
	}
	sess, err := s.session(ctx, "body.session", in.Body.Session)
	if err != nil {
		return nil, err
	}
	store, err := s.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	locker, err := s.locker(ctx, sess.lease, sess.holder())
	if err != nil {
		return nil, err
	}
	defer locker.Close(context.WithoutCancel(ctx))
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if wait > 0 {
		cctx, cancel = context.WithTimeout(ctx, wait)
	}
	l, err := store.Claim(cctx, locker, in.ID, task.ClaimOptions{Wait: wait > 0, Held: ctx})
	cancel()
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, sessionGone(in.Body.Session, s.nsOf(ctx)) // it ended since it was read
	}
	if err != nil {
		return nil, taskProblem(err)
	}
	cp, err := store.Load(ctx, in.ID)
	if err == nil && in.Body.Steps > 0 && cp.Step > 0 && cp.Steps != in.Body.Steps {
		err = fmt.Errorf("task %s: checkpoint at step %d of %d, but the claim says %d steps: %w", in.ID, cp.Step, cp.Steps, in.Body.Steps, task.ErrStepsChanged)
	}
	if err == nil && in.Body.Steps > 0 && cp.Step == 0 && cp.Steps == 0 {
		// Step writes that leave steps out take the claim's count: keep it.
		cp, err = store.SetSteps(ctx, l, cp, in.Body.Steps)
	}
	asleep := err == nil && !cp.Completed && cp.SleepUntil.After(time.Now())
	var sg *task.Signal
	if err == nil && !cp.Completed && cp.Wait != nil {
		sg, err = store.ClaimSignal(ctx, in.ID, cp.Wait, l.Token(), time.Now())
	}
	waiting := err == nil && !cp.Completed && cp.Wait != nil && sg == nil
	if err == nil && !cp.Completed && cp.Spawn != nil && !asleep {
		var ready bool
		ready, err = s.awaitChildren(ctx, store, l, cp) // submits them if a crash cut the spawning write short
		waiting = err == nil && !ready
	}
	var tp string
	if err == nil && !cp.Completed {
		tp, err = store.KeepTraceParent(ctx, l, in.ID, cmp.Or(in.Body.TraceParent, otelspan.TraceParent(ctx)))
	}
	if err != nil || cp.Completed || asleep || waiting {
		rctx, rcancel := cleanupContext(ctx) // nothing is held on error, nor for a completed or sleeping task
		_ = l.Release(rctx)
		rcancel()
		if err != nil {
			return nil, taskProblem(err)
		}
	}
	out := AgentTaskClaim{TaskID: in.ID, Session: in.Body.Session, Holder: l.Holder(), Step: cp.Step, StepName: cp.StepName,
		Steps: cp.Steps, Completed: cp.Completed, State: cp.State, Result: agentTaskOf(cp).Result, TraceParent: tp}
	switch {
	case asleep:
		until := cp.SleepUntil
		out.SleepUntil, out.NextStep = &until, cp.Step+1
	case waiting:
		out.WaitingFor, out.NextStep = agentTaskOf(cp).WaitingFor, cp.Step+1
	case !cp.Completed:
		exp := sess.lease.Deadline().UTC()
		out.Token, out.ExpiresAt, out.NextStep, out.Signal = l.Token(), &exp, cp.Step+1, signalOf(sg)
	}
	if out.Steps == 0 {
		out.Steps = in.Body.Steps
	}
	return &struct{ Body AgentTaskClaim }{out}, nil
}

// claimFence finds task id's claim held with token under session: the
// fence of the task's writes (a 409 when it is not held so).
func (s *Server) claimFence(ctx context.Context, id, session string, token int64) (*heldLock, error) {
	if err := task.CheckID(id); err != nil {
		return nil, problem(err, taskWhere)
	}
	return s.heldLock(ctx, keyspace.TaskLock(id), token, session, "body.session")
}

func (s *Server) putTaskStep(ctx context.Context, in *stepInput) (*agentTaskOutput, error) {
	b := in.Body
	if err := checkStepWrite(in.N, b.Steps, b.State.Bytes()); err != nil {
		return nil, err
	}
	until, err := stepSleep(b.SleepFor, b.SleepUntil, b.Steps > 0 && in.N == b.Steps)
	if err != nil {
		return nil, err
	}
	wait, err := stepWait(b.WaitSignal, b.SleepFor != "" || b.SleepUntil != "", b.Steps > 0 && in.N == b.Steps, time.Now())
	if err != nil {
		return nil, err
	}
	return s.writeStep(ctx, in.ID, in.N, stepWrite{Session: b.Session, Token: b.Token, Name: b.Name, Steps: b.Steps, State: b.State.Bytes(), Until: until, Wait: wait})
}

// checkStepWrite refuses a step write whose state is too large or whose
// number is past its steps.
func checkStepWrite(n, steps int, state []byte) error {
	if len(state) > task.DefaultStateLimit {
		return invalid("body.state", fmt.Sprintf("%d bytes", len(state)),
			fmt.Sprintf("must be at most %d bytes: keep large state in an object store or PostgreSQL and checkpoint its URI", task.DefaultStateLimit))
	}
	if steps > 0 && n > steps {
		return invalid("path.n", n, fmt.Sprintf("must be at most steps (%d)", steps))
	}
	return nil
}

// stepWrite is a step write as the step and spawn routes take it: what
// the step returned, and what it ends with (a sleep until Until, a wait,
// or children to spawn; at most one).
type stepWrite struct {
	Session string
	Token   int64
	Name    string
	Steps   int
	State   []byte
	Until   time.Time
	Wait    *task.Wait
	Spawn   *task.SpawnRequest
}

// writeStep writes step n of task id, fenced by the claim the write names.
func (s *Server) writeStep(ctx context.Context, id string, n int, b stepWrite) (*agentTaskOutput, error) {
	if err := task.CheckID(id); err != nil {
		return nil, problem(err, taskWhere)
	}
	store, err := s.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := store.Load(ctx, id)
	if err != nil {
		return nil, taskProblem(err)
	}
	// A repeated write, already applied, is answered before the fence: a
	// write that slept or completed gave the claim up with it, unless it
	// ended before (finishParked).
	if n == cp.Step && cp.Token == b.Token && bytes.Equal(cp.State, b.State) {
		s.finishParked(ctx, store, cp, b.Session, b.Token)
		return &agentTaskOutput{Body: agentTaskOf(cp)}, nil
	}
	f, err := s.claimFence(ctx, id, b.Session, b.Token)
	if err != nil {
		return nil, err
	}
	steps := b.Steps
	if steps == 0 {
		steps = cp.Steps
	}
	switch {
	case cp.Completed:
		return nil, newProblem(http.StatusConflict, "conflict", fmt.Sprintf("task %s is completed: nothing more is written", id))
	case n != cp.Step+1:
		return nil, newProblem(http.StatusConflict, "conflict",
			fmt.Sprintf("task %s: step %d cannot be written: %s, the next step is %d", id, n, task.CheckpointedUpTo(cp.Step), cp.Step+1))
	case b.Steps > 0 && cp.Step > 0 && cp.Steps != 0 && cp.Steps != b.Steps:
		return nil, taskProblem(fmt.Errorf("task %s: checkpoint at step %d of %d, but this write says %d steps: %w", id, cp.Step, cp.Steps, b.Steps, task.ErrStepsChanged))
	case b.Spawn != nil && len(b.Spawn.Children) > 0 && steps > 0 && n == steps:
		return nil, invalid("body.children", len(b.Spawn.Children), fmt.Sprintf("must be empty in a write of the last step (%d of %d): no step follows to read the children's outcomes", n, steps))
	}
	if err := s.childrenReady(ctx, store, f, cp); err != nil {
		return nil, err
	}
	sg, err := stepSignal(ctx, store, cp, b.Token)
	if err != nil {
		return nil, err
	}
	name := b.Name
	if name == "" {
		name = fmt.Sprintf("step %d", n)
	}
	started := cp.At
	if started.IsZero() {
		started = time.Now()
	}
	now := time.Now().UTC()
	next := task.Checkpoint{TaskID: id, Step: n, StepName: name, Steps: steps, Completed: steps > 0 && n == steps,
		State: b.State, Worker: f.holder.ID, Token: b.Token, At: now}
	if !next.Completed {
		next.SleepUntil, next.Wait = b.Until, b.Wait
	}
	rec := task.StepRecord{Step: n, Name: name, Worker: f.holder.ID, Token: b.Token, StartedAt: started.UTC(), FinishedAt: now}
	if err := s.commitStep(ctx, store, f, cp, &next, rec, sg, b.Spawn); err != nil {
		return nil, err
	}
	if next.Completed || !next.SleepUntil.IsZero() || next.Wait != nil || next.Spawn != nil {
		s.endAgentStream(ctx, id, f, next)
		s.releaseClaim(ctx, id, f) // done, or parked: nothing is held while it sleeps or waits
	}
	return &agentTaskOutput{Body: agentTaskOf(next)}, nil
}

// stepSignal is the signal the step after checkpoint cp consumes when cp
// waits: the one the claim with token was answered with, found again
// under the token (nil when cp does not wait). A 409 when none had come
// when the claim was taken.
func stepSignal(ctx context.Context, store *task.Store, cp task.Checkpoint, token int64) (*task.Signal, error) {
	if cp.Wait == nil {
		return nil, nil
	}
	sg, err := store.ClaimSignal(ctx, cp.TaskID, cp.Wait, token, time.Now())
	if err != nil {
		return nil, taskProblem(err)
	}
	if sg == nil {
		return nil, newProblem(http.StatusConflict, "conflict", fmt.Sprintf("task %s waits for signal %s, which had not come when it was claimed: claim it again once it was sent",
			cp.TaskID, strings.Join(cp.Wait.Signals, " or ")))
	}
	return sg, nil
}

// finishParked ends what a write of checkpoint cp left undone when it
// parks the task (a spawn, a wait, a sleep, the last step) and its writer
// answered no more (a crash, a timeout): while the claim is still held
// with token under session, the children of a spawn are submitted and
// the claim released, so that a repeated write does not leave the task
// held with nothing to do.
func (s *Server) finishParked(ctx context.Context, store *task.Store, cp task.Checkpoint, session string, token int64) {
	if !cp.Completed && cp.SleepUntil.IsZero() && cp.Wait == nil && cp.Spawn == nil {
		return
	}
	f, err := s.claimFence(ctx, cp.TaskID, session, token)
	if err != nil {
		return // released already, or claimed since
	}
	if cp.Spawn != nil {
		if _, err := s.awaitChildren(ctx, store, f, cp); err != nil {
			s.cfg.Logger.Warn("agent task: children not submitted yet; the next claim submits them", "task", cp.TaskID, "step", cp.Step, "err", err)
		}
	}
	s.endAgentStream(ctx, cp.TaskID, f, cp) // as the first write would have
	s.releaseClaim(ctx, cp.TaskID, f)
}

// childrenReady is nil when the step after checkpoint cp may be written
// (or the task completed) under fence f: cp spawned no children, or they
// were submitted (now, if a crash cut the spawn short) and the wait for
// them is over; else a 409.
func (s *Server) childrenReady(ctx context.Context, store *task.Store, f lease.Fence, cp task.Checkpoint) error {
	if cp.Spawn == nil {
		return nil
	}
	ready, err := s.awaitChildren(ctx, store, f, cp)
	if err != nil {
		return err
	}
	if !ready {
		return newProblem(http.StatusConflict, "conflict", fmt.Sprintf("task %s: the children step %d spawned have not ended yet (%d of %d must): claim the task again once they did",
			cp.TaskID, cp.Step, cp.Spawn.Wait, cp.Spawn.N))
	}
	return nil
}

// releaseClaim releases a task's claim after its completion; a failure
// leaves it to the session's end.
func (s *Server) releaseClaim(ctx context.Context, id string, f *heldLock) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_, err := s.cli.Txn(rctx).If(clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.token)).Then(clientv3.OpDelete(f.key)).Commit()
	if err != nil {
		s.cfg.Logger.Warn("agent task: release after completion failed; the claim ends with its session", "task", id, "err", err)
	}
}

func (s *Server) completeTask(ctx context.Context, in *completeInput) (*agentTaskOutput, error) {
	b := in.Body
	result, err := resultBytes(b.Result)
	if err != nil {
		return nil, err
	}
	f, err := s.claimFence(ctx, in.ID, b.Session, b.Token)
	if err != nil {
		return nil, err
	}
	store, err := s.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	prev, err := store.Load(ctx, in.ID)
	if err != nil {
		return nil, taskProblem(err)
	}
	if err := s.childrenReady(ctx, store, f, prev); err != nil {
		return nil, err
	}
	cp, err := store.Complete(ctx, f, in.ID, result, f.holder.ID)
	if err != nil {
		return nil, taskProblem(err)
	}
	s.finishAgentStream(ctx, in.ID)
	s.releaseClaim(ctx, in.ID, f)
	return &agentTaskOutput{Body: agentTaskOf(cp)}, nil
}

// resultBytes is the bytes a completion's result keeps as the task's final
// state: a JSON string is base64 of them (as a step's state is, and as
// clients sent results before any JSON value was taken), any other JSON
// value its own JSON text; null or nothing keeps the last step's state.
func resultBytes(raw json.RawMessage) ([]byte, error) {
	var out []byte
	switch {
	case len(raw) == 0 || string(raw) == "null":
		return nil, nil
	case raw[0] == '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, invalid("body.result", nil, "must be valid JSON")
		}
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil {
			return nil, invalid("body.result", nil, "a string must be base64 (of the result's bytes); send any other result as the JSON value it is (an object, array, number or boolean)")
		}
		out = b
	default:
		out = []byte(raw)
	}
	if len(out) > task.DefaultStateLimit {
		return nil, invalid("body.result", fmt.Sprintf("%d bytes", len(out)), fmt.Sprintf("must be at most %d bytes", task.DefaultStateLimit))
	}
	return out, nil
}

func (s *Server) releaseTask(ctx context.Context, in *releaseTaskInput) (*struct{}, error) {
	f, err := s.claimFence(ctx, in.ID, in.Session, in.Token)
	if err != nil {
		var p *Problem
		if errors.As(err, &p) && p.Status == http.StatusConflict {
			p.Type, p.Detail = problemBase+"lock-not-held", p.Detail+": nothing was released"
		}
		return nil, err
	}
	s.endAgentAttempt(ctx, in.ID, f, "handed back")
	resp, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(f.key), "=", f.token)).Then(clientv3.OpDelete(f.key)).Commit()
	if err != nil {
		return nil, problem(fmt.Errorf("release the claim of task %s: %w", in.ID, err), nil)
	}
	if !resp.Succeeded {
		return nil, newProblem(http.StatusConflict, "lock-not-held", fmt.Sprintf("the claim of task %s with token %d ended meanwhile: nothing was released", in.ID, in.Token))
	}
	return nil, nil
}

func (s *Server) getTask(ctx context.Context, in *agentTaskPath) (*agentTaskOutput, error) {
	if err := task.CheckID(in.ID); err != nil {
		return nil, problem(err, taskWhere)
	}
	store, err := s.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := store.Load(ctx, in.ID)
	if err != nil {
		return nil, taskProblem(err)
	}
	hist, err := store.History(ctx, in.ID)
	if err != nil {
		return nil, taskProblem(err)
	}
	l, err := s.locker(ctx, nil, lock.Holder{})
	if err != nil {
		return nil, err
	}
	defer l.Close(context.WithoutCancel(ctx))
	st, err := l.Status(ctx, keyspace.TaskLock(in.ID))
	if err != nil {
		return nil, problem(err, nil)
	}
	if cp.At.IsZero() && len(hist) == 0 && !st.Held {
		return nil, newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("agent task %s has no checkpoint and no claim in namespace %s", in.ID, s.nsOf(ctx)))
	}
	out := agentTaskOf(cp)
	for _, r := range hist {
		out.History = append(out.History, AgentTaskStep(r))
	}
	if st.Held {
		c := lockStatusOf(st)
		out.Claim = &c
	}
	return &agentTaskOutput{Body: out}, nil
}
