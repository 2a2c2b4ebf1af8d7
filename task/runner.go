package task

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
)

// RunnerConfig configures a Runner. The zero value is valid.
type RunnerConfig struct {
	// Namespace of the keys; "" means "drover".
	Namespace string
	// WorkerID names this worker in locks and step records; "" means
	// "host:pid".
	WorkerID string
	// TTL of the runner's lease when Lease is nil: how soon another worker
	// takes over after this one dies. Zero means lock.DefaultTTL. Unset
	// with Locker, which has a TTL of its own.
	TTL time.Duration
	// Lease, when set, binds the runner's task locks to it (for example the
	// process's primary lease); the runner does not close it. Unset with
	// Locker.
	Lease *lease.Lease
	// Locker, when set, is where the runner takes each task's lock
	// ("task:ID", waiting with Acquire): a redislock.Locker,
	// redislock.Redlock or paxoslock.Locker. Steps run under the lock's
	// context, and each checkpoint (the last one with the completion mark)
	// is written in one etcd transaction fenced by the lock's token: it
	// commits only if no write under a higher token was made for the task,
	// and the runner raises the task's highest token to its own as soon as
	// it holds the lock, so a holder that lost the lock (paused, cut off)
	// writes nothing once its successor holds it. A *lock.Etcd takes the etcd claim through that
	// locker instead. The runner does not close Locker. nil means the
	// runner's own etcd claim, on its own lease (TTL) or on Lease.
	Locker lock.Locker
	// StateLimit is the largest state a step may return, in bytes; 0 means
	// DefaultStateLimit, at most MaxStateLimit.
	StateLimit int
	// OnEvent, if set, is called synchronously for every event.
	OnEvent func(Event)
	// Logger; nil means slog.Default().
	Logger *slog.Logger
	// Now is the clock steps' sleeps are counted and judged by; nil means
	// time.Now.
	Now func() time.Time
	// Spawner submits the children a step spawns (see Spawn): with one, a
	// step of a named task can spawn, and a Run stops while they run
	// (Result.Waiting.Children) as it does for a wait; run the task again
	// once they ended. nil: a step cannot spawn.
	Spawner Spawner
	// TracerProvider makes each Run's attempt span (see Run); nil, or
	// otel.GetTracerProvider() passed as it is, means the global
	// provider, a no-op (and no etcd read) until one is set.
	TracerProvider trace.TracerProvider
}

// Validate reports the first field that is not usable.
func (c RunnerConfig) Validate() error {
	if _, err := keyspace.New(c.Namespace); err != nil {
		return err
	}
	if c.WorkerID != "" {
		if err := keyspace.CheckName("worker id", c.WorkerID); err != nil {
			return err
		}
	}
	if c.Lease == nil && c.TTL != 0 {
		if err := lease.CheckTTL("ttl", c.TTL); err != nil {
			return err
		}
	}
	if c.Locker != nil && c.TTL != 0 {
		return &drover.InputError{Field: "ttl", Value: c.TTL, Rule: "must be unset with a Locker: set the TTL on the Locker, whose locks the runner holds"}
	}
	if c.Locker != nil && c.Lease != nil {
		return &drover.InputError{Field: "lease", Rule: "must be unset with a Locker: the Locker's locks have lifetimes of their own"}
	}
	if c.StateLimit < 0 || c.StateLimit > MaxStateLimit {
		return &drover.InputError{Field: "state limit", Value: c.StateLimit, Rule: fmt.Sprintf("must be between 1 and %d bytes (0 means %d)", MaxStateLimit, DefaultStateLimit)}
	}
	return nil
}

// Runner runs tasks so that one worker at a time runs each, resuming from the
// last checkpoint. A Runner is safe for concurrent use; each Run takes its
// own task lock.
type Runner struct {
	store *Store
	// locker takes etcd claims; nil when other (RunnerConfig.Locker, not
	// etcd) takes the tasks' locks.
	locker     *lock.Etcd
	ownsLocker bool
	other      lock.Locker
	worker     string
	limit      int
	onEvent    func(Event)
	logger     *slog.Logger
	now        func() time.Time
	spawner    Spawner
	tracer     trace.Tracer
}

// NewRunner returns a runner on cli. Close it to release its lease.
func NewRunner(ctx context.Context, cli *clientv3.Client, cfg RunnerConfig) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	store, err := NewStore(cli, cfg.Namespace)
	if err != nil {
		return nil, err
	}
	limit := cfg.StateLimit
	if limit == 0 {
		limit = DefaultStateLimit
	}
	r := &Runner{store: store, worker: lock.NewHolder(cfg.WorkerID).ID, limit: limit, onEvent: cfg.OnEvent, logger: logger, now: cfg.Now, spawner: cfg.Spawner,
		tracer: runnerTracer(cfg.TracerProvider)}
	switch l := cfg.Locker.(type) {
	case nil:
		locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: cfg.Namespace, TTL: cfg.TTL, Lease: cfg.Lease, HolderID: cfg.WorkerID, Logger: logger})
		if err != nil {
			return nil, fmt.Errorf("task: %w", err)
		}
		r.locker, r.ownsLocker = locker, true
	case *lock.Etcd:
		r.locker = l
	default:
		r.other = l
	}
	return r, nil
}

// Store returns the runner's checkpoint store.
func (r *Runner) Store() *Store { return r.store }

// Worker returns the worker id the runner records.
func (r *Runner) Worker() string { return r.worker }

// Lease returns the lease the runner's task locks are bound to; nil when
// RunnerConfig.Locker is of another backend than etcd.
func (r *Runner) Lease() *lease.Lease {
	if r.locker == nil {
		return nil
	}
	return r.locker.Lease()
}

// Close releases the runner's own lease, and with it any task it holds. A
// RunnerConfig.Locker is left open: its creator closes it.
func (r *Runner) Close(ctx context.Context) error {
	if !r.ownsLocker {
		return nil
	}
	return r.locker.Close(ctx)
}

func (r *Runner) emit(ev Event) {
	if r.onEvent == nil {
		return
	}
	ev.Worker = r.worker
	if ev.At.IsZero() {
		ev.At = time.Now()
	}
	r.onEvent(ev)
}

// Result says what a Run did.
type Result struct {
	TaskID string
	// Token is the fencing token this run held the task under.
	Token int64
	// ResumedFrom is the first step this run ran (1 for a fresh task).
	ResumedFrom int
	// StepsRun counts the steps this run ran and checkpointed.
	StepsRun int
	// AlreadyCompleted is true when the task was complete before this run.
	AlreadyCompleted bool
	// State is the final state.
	State []byte
	// SleepingUntil, when set, says the run stopped because the task
	// sleeps until then: a step ended with a SleepRequest (its state
	// checkpointed), or the checkpoint loaded was still asleep. Nothing is
	// held; run the task again at that time to resume it.
	SleepingUntil time.Time
	// Waiting, when set, says the run stopped because the task waits for
	// a signal: a step ended with a WaitRequest (its state checkpointed),
	// or the checkpoint loaded waits and no signal for it has arrived (nor
	// its timeout passed). Nothing is held. Or, with Waiting.Children set,
	// for the children a step spawned (see Spawn): they are submitted, and
	// the next step runs once enough of them ended.
	Waiting *Wait
}

// CheckSteps returns a drover.InputError unless steps is a usable step list:
// at least one step, each with a unique non-empty name and a function.
func CheckSteps(steps []Step) error {
	if len(steps) == 0 {
		return &drover.InputError{Field: "steps", Rule: "must list at least one step"}
	}
	seen := map[string]bool{}
	for i, s := range steps {
		switch {
		case s.Name == "":
			return &drover.InputError{Field: fmt.Sprintf("steps[%d].name", i), Rule: "must not be empty"}
		case len(s.Name) > 200:
			return &drover.InputError{Field: fmt.Sprintf("steps[%d].name", i), Value: s.Name, Rule: "must be at most 200 bytes"}
		case seen[s.Name]:
			return &drover.InputError{Field: fmt.Sprintf("steps[%d].name", i), Value: s.Name, Rule: "must be unique within the task"}
		case s.Run == nil:
			return &drover.InputError{Field: fmt.Sprintf("steps[%d].run", i), Rule: "must be set"}
		}
		seen[s.Name] = true
	}
	return nil
}

// Run runs task id to completion, or as far as it gets. It waits, on a
// watch, while another worker holds the task; ctx bounds the wait and the
// run. It resumes after the last checkpointed step, and returns once the last
// step is checkpointed (or was before), or with the first error: a step's
// error (ErrStepFailed), a refused checkpoint (lock.ErrFenced), too much
// state (ErrStateTooLarge), a full store (drover.ErrStoreFull: the step ran
// but its checkpoint was not written, so a later Run starts at that step),
// or ctx's. The task's lock is released when Run returns.
//
// Steps emit to the task's stream through their context (stream.Emit,
// stream.Token), fenced by the task's lock: each Run that writes is an
// attempt of the stream, whose events follow an attempt_lost boundary
// when the run before lost the task; a completed task's stream ends with
// done, and a run that parks the task or fails ends its events with
// attempt_ended.
//
// A step that ends with a SleepRequest (Sleep, SleepUntil) ends the run
// once its checkpoint is written: Run returns a nil error with
// Result.SleepingUntil set, and the lock is released, so nothing is held
// while the task sleeps. Run it again at that time (from any worker) to
// resume at the next step; a Run before then returns at once the same
// way, running nothing. A step that ends with a WaitRequest (WaitSignal)
// ends the run the same way, with Result.Waiting set: a named task has
// no queue to park on, so run it again once the signal was sent (or the
// wait's timeout passed) to resume it with the signal; a Run before that
// runs nothing.
//
// Each Run that claims the task is an attempt span, "process
// agent-tasks", a child of the traceparent kept with the task and linked
// to it (the first run's caller's, or a client's claim's), as the HTTP
// API's agent task claims are; its steps' spans are its children.
func (r *Runner) Run(ctx context.Context, id string, steps []Step) (Result, error) {
	if err := CheckID(id); err != nil {
		return Result{}, err
	}
	if err := CheckSteps(steps); err != nil {
		return Result{}, err
	}
	f, release, err := r.claim(ctx, id)
	if err != nil {
		return Result{TaskID: id}, err
	}
	ctx, span := r.startRun(ctx, f, id, time.Now())
	var res Result
	var stopped error // why the run's context ended, if it did before RunSteps returned
	defer func() { endRun(span, res, err, stopped) }()
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := release(rctx); err != nil && !errors.Is(err, lock.ErrNotHeld) {
			r.logger.Warn("task: release failed; the lock frees itself when its TTL ends", "task", id, "err", err)
		}
	}()
	r.emit(Event{Type: EventAcquired, TaskID: id, Token: f.Token()})
	lctx := f.Context()
	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(lctx, func() { cancel(context.Cause(lctx)) })
	defer stop()
	runCtx, at, err := r.beginStream(runCtx, id, f)
	if err != nil {
		return Result{TaskID: id, Token: f.Token()}, err
	}
	res, err = r.store.RunSteps(runCtx, f, id, steps, StepConfig{Worker: r.worker, StateLimit: r.limit, OnEvent: r.emit, Now: r.now, Spawner: r.spawner})
	stopped = context.Cause(runCtx)
	r.endStream(ctx, at, f, res, err)
	return res, err
}

// claim waits in line for task id's lock, then for a queue worker running
// the task: an etcd claim (Claim), or the lock of RunnerConfig.Locker
// (claimLock). It returns the fence of the task's writes and its release;
// on error nothing is held.
func (r *Runner) claim(ctx context.Context, id string) (lease.Fence, func(context.Context) error, error) {
	o := ClaimOptions{Wait: true, OnEvent: r.emit}
	if r.locker == nil {
		f, err := r.store.claimLock(ctx, r.other, id, o)
		if err != nil {
			return nil, nil, err
		}
		return f, f.Release, nil
	}
	l, err := r.store.Claim(ctx, r.locker, id, o)
	if err != nil {
		return nil, nil, err
	}
	return l, l.Release, nil
}

// StepConfig says how RunSteps runs and reports a task's steps.
type StepConfig struct {
	// Worker is recorded in checkpoints and step records.
	Worker string
	// Initial is the state the first step gets when there is no checkpoint.
	Initial []byte
	// StateLimit bounds a step's state; 0 means DefaultStateLimit.
	StateLimit int
	// OnEvent, if set, receives every event (Worker is filled in by the
	// caller's own emitter).
	OnEvent func(Event)
	// Now is the clock that sleeps are counted and judged by; nil means
	// time.Now.
	Now func() time.Time
	// Spawner submits the children a step spawns (see Spawn); nil: a
	// step cannot spawn.
	Spawner Spawner
	// ClaimedAt, when set, is the etcd revision the caller's claim of the
	// task was made at (a queue claim's): the checkpoint is then read
	// without a read index round when the etcd member is past it.
	ClaimedAt int64
}

// RunSteps runs task id's steps under fence f, which the caller holds (a
// task lock, a queue claim): it loads the checkpoint, resumes after the last
// checkpointed step, and writes each step's checkpoint and record in one
// transaction fenced by f. ctx is what the steps get; the caller ends it when
// f is lost. This is the one implementation of step-wise resume, shared by
// Runner and by queue handlers.
//
// A step that ends with a SleepRequest has its state checkpointed with the
// time the sleep ends, and RunSteps returns with Result.SleepingUntil set;
// so it does, running nothing, when the checkpoint's sleep has not ended
// on cfg.Now's clock; a sleep that ends within SleepMargin it waits out
// in-process, then runs on.
func (s *Store) RunSteps(ctx context.Context, f lease.Fence, id string, steps []Step, cfg StepConfig) (Result, error) {
	if err := CheckSteps(steps); err != nil {
		return Result{}, err
	}
	r := stepRun{s: s, f: f, id: id, steps: steps, cfg: cfg, emit: cfg.OnEvent, now: cfg.Now, limit: cfg.StateLimit}
	if r.emit == nil {
		r.emit = func(Event) {}
	}
	if r.now == nil {
		r.now = time.Now
	}
	if r.limit <= 0 {
		r.limit = DefaultStateLimit
	}
	res := Result{TaskID: id, Token: f.Token()}
	cp, err := s.loadAfter(ctx, id, cfg.ClaimedAt)
	if err != nil {
		return res, err
	}
	res.State = cp.State
	if cp.Completed {
		res.AlreadyCompleted = true
		r.emit(Event{Type: EventAlreadyCompleted, TaskID: id, Step: cp.Step})
		return res, nil
	}
	if cp.Step > 0 && cp.Steps != len(steps) {
		return res, fmt.Errorf("task %s: checkpoint at step %d of %d, but %d steps were given: %w", id, cp.Step, cp.Steps, len(steps), ErrStepsChanged)
	}
	if near, err := WaitNearSleep(ctx, cp.SleepUntil, r.now); err != nil {
		return res, err
	} else if !near {
		res.SleepingUntil = cp.SleepUntil
		r.emit(Event{Type: EventSleeping, TaskID: id, Step: cp.Step, Name: cp.StepName, Until: cp.SleepUntil})
		return res, nil
	}
	var sg *Signal
	if cp.Wait != nil {
		if sg, err = s.resumeWait(ctx, id, cp.Wait, r.now); err != nil {
			return res, err
		} else if sg == nil {
			res.Waiting = cp.Wait
			r.emit(Event{Type: EventAwaitingSignal, TaskID: id, Step: cp.Step, Name: cp.StepName, Until: cp.Wait.Until, Signals: cp.Wait.Signals})
			return res, nil
		}
	}
	if cp.Step == 0 {
		cp.State = cfg.Initial
	}
	if cp.Spawn != nil {
		if waiting, err := r.waiting(ctx, cp, &res); waiting || err != nil {
			return res, err
		}
	}
	res.ResumedFrom = cp.Step + 1
	if cp.Step < len(steps) {
		r.emit(Event{Type: EventResumed, TaskID: id, Step: res.ResumedFrom, Name: steps[cp.Step].Name})
	}
	for i := cp.Step; i < len(steps); i++ {
		next, err := r.step(r.withChildren(ctx, cp), i, cp, sg)
		if err != nil {
			return res, err
		}
		cp, sg = next, nil
		res.StepsRun++
		res.State = next.State
		if stop, err := r.stopsAfter(ctx, next, &res); stop || err != nil {
			return res, err
		}
	}
	r.waitsOver(ctx, cp, nil, time.Now()) // children the last step spawned
	r.emit(Event{Type: EventCompleted, TaskID: id, Step: len(steps)})
	return res, nil
}

// stopsAfter reports whether the run stops after checkpoint next, whose
// step asked for a sleep, a signal or children to wait for (res says
// which; children that ended already do not stop it).
func (r *stepRun) stopsAfter(ctx context.Context, next Checkpoint, res *Result) (bool, error) {
	switch {
	case !next.SleepUntil.IsZero():
		res.SleepingUntil = next.SleepUntil
		r.emit(Event{Type: EventSleeping, TaskID: r.id, Step: next.Step, Name: next.StepName, Until: next.SleepUntil})
		return true, nil
	case next.Wait != nil:
		res.Waiting = next.Wait
		r.emit(Event{Type: EventAwaitingSignal, TaskID: r.id, Step: next.Step, Name: next.StepName, Until: next.Wait.Until, Signals: next.Wait.Signals})
		return true, nil
	case next.Spawn != nil:
		return r.waiting(ctx, next, res)
	}
	return false, nil
}

// stepRun is one RunSteps call.
type stepRun struct {
	s     *Store
	f     lease.Fence
	id    string
	steps []Step
	cfg   StepConfig
	emit  func(Event)
	now   func() time.Time
	limit int
	// planned is the list of children this run wrote the plan of, for
	// step plannedStep: submitted from memory, not read back.
	planned     []Child
	plannedStep int
	// children is the wait for the children of the checkpoint the run
	// resumes from, over: its span is recorded once the next step's
	// checkpoint commits (or, no step following, as the run ends), so
	// that an attempt whose step fails does not record it again.
	children *ChildWait
}

// waitsOver records the spans of the waits checkpoint cp ended with, up
// to the start of the step after it: the children it waited for, the
// signal sg it got. Called once that step's checkpoint commits, which
// consumes the waits: a step that fails and runs again records them
// once.
func (r *stepRun) waitsOver(ctx context.Context, cp Checkpoint, sg *Signal, started time.Time) {
	if w := r.children; w != nil && w.Step == cp.Step {
		otelspan.ChildrenWait(ctx, r.id, cp.Step, w.N, w.Wait, cp.At, started)
	}
	r.children = nil
	if sg != nil && cp.Wait != nil {
		otelspan.SignalWait(ctx, r.id, cp.Step, cp.Wait.Signals, sg.Name, sg.TimedOut, cp.Wait.Since, started)
	}
}

// waiting submits the children checkpoint cp's step spawned, if they are
// not yet, and reports whether the run stops to wait for them (with
// res.Waiting set: a wait for children, without a timeout).
func (r *stepRun) waiting(ctx context.Context, cp Checkpoint, res *Result) (bool, error) {
	w, err := r.awaitChildren(ctx, cp)
	if err != nil || w.Ready() {
		if err == nil {
			r.children = &w
		}
		return false, err
	}
	res.Waiting = &Wait{Since: cp.At, Children: &ChildrenWait{Step: cp.Step, N: w.N, Wait: w.Wait, Collect: w.Collect, Rev: w.Rev}}
	r.emit(Event{Type: EventWaitingChildren, TaskID: r.id, Step: cp.Step, Name: cp.StepName})
	return true, nil
}

// step runs step i+1 after checkpoint cp and writes its checkpoint, which
// it returns; a sleep the step asked for is in its SleepUntil, a wait in
// its Wait. sg, when set, is the signal that ended the wait of cp: the
// step gets it through its context, and its checkpoint consumes it.
func (r *stepRun) step(ctx context.Context, i int, cp Checkpoint, sg *Signal) (next Checkpoint, err error) {
	n, step, id, f := i+1, r.steps[i], r.id, r.f
	started, outer := time.Now(), ctx
	ctx, span := otelspan.StartStep(ctx, id, n, step.Name)
	defer func() { otelspan.End(span, err) }()
	if sg != nil {
		ctx = context.WithValue(ctx, signalKey{}, sg)
		ev := Event{Type: EventSignalReceived, TaskID: id, Step: n, Name: sg.Name}
		if sg.TimedOut {
			ev.Err = "timed out"
		}
		r.emit(ev)
	}
	r.emit(Event{Type: EventStepStarted, TaskID: id, Step: n, Name: step.Name, Token: f.Token()})
	state, err := step.Run(ctx, cp.State)
	var until time.Time
	if sl, ok := sleepOf(err); ok && err != nil {
		if until, err = sl.Due(r.now()); err == nil && (n == len(r.steps) || !until.After(r.now())) {
			until = time.Time{} // nothing follows, or the time is past: no sleep
		}
	}
	var wait *Wait
	if wr, ok := waitOf(err); ok && err != nil {
		if err = wr.Check(); err == nil && n < len(r.steps) { // nothing follows the last step: no wait
			wait = wr.Begin(r.now())
		}
	}
	spawnReq, spawns := spawnOf(err)
	if spawns {
		err = nil
	}
	if err != nil {
		if lerr := f.Err(); lerr != nil {
			r.emit(Event{Type: EventLost, TaskID: id, Step: n, Name: step.Name, Err: lerr.Error()})
			return cp, fmt.Errorf("task %s step %d (%s): %w", id, n, step.Name, lerr)
		}
		return cp, &StepError{TaskID: id, Step: n, Name: step.Name, Err: err}
	}
	if len(state) > r.limit {
		return cp, &StateTooLargeError{TaskID: id, Step: n, Name: step.Name, Size: len(state), Limit: r.limit}
	}
	var sp *SpawnRecord
	var pw planWrite
	if spawns {
		if sp, pw, err = r.spawn(ctx, cp, n, spawnReq, len(state)); err != nil {
			return cp, err
		}
	}
	next = Checkpoint{TaskID: id, Step: n, StepName: step.Name, Steps: len(r.steps), Completed: n == len(r.steps) && sp == nil,
		State: state, SleepUntil: until, Wait: wait, Spawn: sp, Worker: r.cfg.Worker, Token: f.Token(), At: time.Now().UTC()}
	rec := StepRecord{Step: n, Name: step.Name, Worker: r.cfg.Worker, Token: f.Token(), StartedAt: started.UTC(), FinishedAt: next.At}
	flushStream(ctx)
	// The fence, not the step's context, decides whether this write
	// counts: commit even if the context ended as the step finished.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	err = r.s.commit(cctx, f, cp, &next, rec, append(r.s.consumeOps(id, sg, next.At), pw.ops...), pw.cmps...)
	ccancel()
	if err != nil {
		if errors.Is(err, lock.ErrFenced) {
			r.emit(Event{Type: EventLost, TaskID: id, Step: n, Name: step.Name, Err: err.Error()})
		}
		return cp, err
	}
	r.waitsOver(outer, cp, sg, started)
	r.emit(Event{Type: EventStepCheckpointed, TaskID: id, Step: n, Name: step.Name, Token: f.Token()})
	return next, nil
}

// CheckpointedUpTo says in words that steps 1..n are checkpointed, for
// progress lines.
func CheckpointedUpTo(n int) string {
	switch n {
	case 0:
		return "no step is checkpointed"
	case 1:
		return "step 1 is checkpointed"
	default:
		return fmt.Sprintf("steps 1-%d are checkpointed", n)
	}
}
