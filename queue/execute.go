package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// notAdmitted turns a gate's refusal into an outcome.
func (w *Worker) notAdmitted(ctx, base context.Context, c *claim, err error) outcome {
	var de *DeferError
	switch cause := context.Cause(ctx); {
	case errors.As(err, &de):
		return outcome{c: c, kind: Pending, err: err, delay: max(de.After, 100*time.Millisecond), deferred: de.Reason}
	case errors.Is(cause, ErrCancelled):
		return outcome{c: c, kind: Cancelled}
	case errors.Is(cause, ErrShutdown):
		return outcome{c: c, kind: Pending, err: ErrShutdown}
	case base.Err() != nil:
		return outcome{c: c, kind: Cancelled, err: context.Cause(base)}
	}
	// A gate that failed (etcd unreachable): hand the task back, uncharged.
	w.logger.Warn("queue: flow control could not admit a task; handing it back", "task", c.task.ID, "err", err)
	return outcome{c: c, kind: Pending, err: err, delay: time.Second, deferred: "gate-error"}
}

// track registers claimed task c as in flight with cancel, which a cancel
// of the task, StopAndCancel, the shutdown timeout and a lost claim call;
// started is when its handler started (zero: it waits for a running
// slot). A StopAndCancel already under way cancels it at once.
func (w *Worker) track(c *claim, cancel context.CancelCauseFunc, started time.Time) {
	r := &running{cancel: cancel, token: c.token, started: started}
	if c.run != nil {
		r.runKey = c.run.runKey
	}
	w.mu.Lock()
	w.inflight[c.task.ID] = r
	w.mu.Unlock()
	if w.hardStop.Load() { // StopAndCancel sets it before it cancels what is in flight
		cancel(ErrShutdown)
	}
}

// untrack removes task id from the tasks in flight.
func (w *Worker) untrack(id string) {
	w.mu.Lock()
	delete(w.inflight, id)
	w.mu.Unlock()
}

// execute runs one claimed task's handler and decides its outcome.
func (w *Worker) execute(base context.Context, c *claim) (o outcome) {
	t := c.task
	if c.broken != nil {
		return outcome{c: c, kind: Dead, err: Permanent(c.broken), streamed: true}
	}
	if t.Attempt > t.Retries()+1 {
		return outcome{c: c, kind: Dead, streamed: true, err: fmt.Errorf("gave up after %d attempts: the worker running it died or lost its claim", t.Attempt-1)}
	}
	timeout := time.Duration(t.Timeout)
	if timeout <= 0 {
		timeout = w.cfg.Timeout
	}
	ctx, cancel := context.WithCancelCause(base)
	defer cancel(nil)
	if w.hardStop.Load() { // claimed as StopAndCancel came: hand it back
		return outcome{c: c, kind: Pending, err: ErrShutdown}
	}
	w.track(c, cancel, time.Now())
	defer w.untrack(t.ID)
	w.mu.Lock()
	h := w.handlers[t.Type]
	if h == nil {
		h = w.fallback
	}
	w.mu.Unlock()
	if h == nil {
		return outcome{c: c, kind: Dead, err: Permanent(fmt.Errorf("%w %q on worker %s", ErrNoHandler, t.Type, w.worker))}
	}
	// Flow control first; waiting there does not count against the
	// task's timeout.
	var dones []func(error)
	for _, g := range w.cfg.Gates {
		done, err := g.Admit(ctx, t)
		if err != nil {
			for _, d := range dones {
				d(ErrNotRun)
			}
			return w.notAdmitted(ctx, base, c, err)
		}
		dones = append(dones, done)
	}
	t.Deferrals = 0 // admitted: the next deferral starts the count again
	tctx, tcancel := context.WithTimeoutCause(ctx, timeout, ErrTimeout)
	defer tcancel()
	f := &claimFence{w: w, c: c, task: t.ID, cancel: cancel, ctx: ctx}
	hctx, sa := w.beginStream(context.WithValue(tctx, claimKey{}, f), f)
	defer func() { w.endStream(ctx, sa, &o); f.gone.Store(true) }() // under the claim, before the outcome is written; then the handler is gone
	began := time.Now()
	result, err := w.runHandler(hctx, h, t, func(err error) { admitted(dones, err) }) // the gates' slots held till it returns
	otelspan.Observe(hctx, metrics.TaskDuration.WithLabelValues(t.Queue, t.Type, outcomeLabel(err)), time.Since(began).Seconds())
	cause := context.Cause(tctx)
	switch {
	case err == nil && len(result) > MaxResult:
		return outcome{c: c, kind: Dead, err: Permanent(fmt.Errorf("%w: %d bytes, over %d", ErrResultLarge, len(result), MaxResult))}
	case err == nil && t.Parent != "" && len(result) > task.MaxChildResult:
		return outcome{c: c, kind: Dead, err: childResultError(len(result))}
	case err == nil:
		return outcome{c: c, kind: Succeeded, result: result}
	case errors.Is(cause, ErrCancelled):
		return outcome{c: c, kind: Cancelled}
	case errors.Is(cause, ErrShutdown):
		return outcome{c: c, kind: Pending, err: ErrShutdown}
	case base.Err() != nil:
		return outcome{c: c, kind: Cancelled, err: context.Cause(base)} // the lease is gone: so are the claims
	case errors.Is(cause, lock.ErrLost):
		return outcome{c: c, kind: Cancelled, err: cause} // the claim is gone: an outcome would be refused
	}
	if o, ok := w.asleep(c, &err); ok {
		return o
	}
	if errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w after %s: %w", ErrTimeout, timeout, err)
	}
	if errors.Is(err, ErrPermanent) || t.Attempt > t.Retries() {
		return outcome{c: c, kind: Dead, err: err}
	}
	return outcome{c: c, kind: Retrying, err: err, delay: w.backoff(t)}
}

// outcomeLabel is the outcome label of a handler's duration.
func outcomeLabel(err error) string {
	switch {
	case isSleep(err):
		return "slept"
	case err != nil:
		return "failed"
	}
	return "succeeded"
}

// admitted tells the flow control gates that admitted a task how its
// handler ended: a sleep is no failure (a breaker does not count it).
func admitted(dones []func(error), err error) {
	if isSleep(err) {
		err = nil
	}
	for _, d := range dones {
		d(err)
	}
}

// call runs h, turning a panic into a permanent failure that carries the
// stack.
func call(ctx context.Context, h Handler, t *Task) (result []byte, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = Permanent(fmt.Errorf("handler panicked: %v\n%s", r, debug.Stack()))
		}
	}()
	return h(ctx, t)
}

// backoff is a full-jitter exponential delay for the task's next attempt.
func (w *Worker) backoff(t *Task) time.Duration {
	base, maxd := time.Duration(t.BackoffBase), time.Duration(t.BackoffMax)
	if base <= 0 {
		base = w.cfg.BackoffBase
	}
	if maxd <= 0 {
		maxd = w.cfg.BackoffMax
	}
	ceil := maxd
	if shift := t.Attempt - 1; shift < 40 && base<<shift > 0 && base<<shift < maxd {
		ceil = base << shift
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// slotPool counts a worker's task slots: the tasks it holds claimed,
// running or waiting to run. A claimer reserves slots before it claims, so
// that claimers running at once never claim more tasks than there are
// slots, and gives back those its claim did not fill. held slots are not
// to be reserved for now (see Worker.aheadHeld).
type slotPool struct {
	mu    sync.Mutex
	free  int
	size  int
	held  int
	freed chan struct{} // closed, and replaced, whenever slots come free
	ended chan struct{} // closed, and replaced, whenever a task ends
}

func newSlotPool(n, held int) *slotPool {
	return &slotPool{free: n, size: n, held: held, freed: make(chan struct{}), ended: make(chan struct{})}
}

// hold keeps n slots from being reserved (0: all may be).
func (p *slotPool) hold(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if n < p.held {
		close(p.freed)
		p.freed = make(chan struct{})
	}
	p.held = n
}

// reserve takes up to n free slots; with none free it returns 0 and a
// channel closed once some come free.
func (p *slotPool) reserve(n int) (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	k := max(0, min(n, p.free-p.held))
	p.free -= k
	return k, p.freed
}

// release gives back n reserved slots that a claim did not fill, and wakes
// claimers waiting for a slot.
func (p *slotPool) release(n int) {
	if n == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free += n
	close(p.freed)
	p.freed = make(chan struct{})
}

// end gives back the slot of a task that ended, and wakes claimers waiting
// for a slot or for a task to end.
func (p *slotPool) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.free++
	close(p.freed)
	p.freed = make(chan struct{})
	close(p.ended)
	p.ended = make(chan struct{})
}

// state returns how many slots are in use (running or reserved) and a
// channel closed once a task ends.
func (p *slotPool) state() (int, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.size - p.free, p.ended
}

// gather waits, for at most d, until want slots are free or no task is
// running (a claim of a few slots costs the round trips of a claim of many),
// or until stop is closed.
func (p *slotPool) gather(want int, d time.Duration, stop <-chan struct{}) {
	var timer *time.Timer
	for {
		p.mu.Lock()
		free, busy, freed := max(0, p.free-p.held), p.size-p.free, p.freed
		p.mu.Unlock()
		if free >= want || busy == 0 || free == 0 {
			return
		}
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		}
		select {
		case <-freed:
		case <-timer.C:
			return
		case <-stop:
			return
		}
	}
}

// ExitPermanent is the exit code (EX_DATAERR) with which an exec handler's
// command says its failure is permanent.
const ExitPermanent = 65

// DefaultMaxOutput bounds an exec handler's result.
const DefaultMaxOutput = MaxResult

// ExecHandler returns a handler that runs argv in a process of its own for
// each task, so that tasks are isolated from each other and from the
// worker: the task as JSON on standard
// input, its standard output (at most maxOutput bytes; 0 means
// DefaultMaxOutput) as the result. Exit 0 is success; exit 65 (EX_DATAERR) a
// permanent failure; any other exit, a signal, or a timeout a transient one.
// More output than maxOutput is a permanent failure, and the excess is
// discarded as it arrives, so no amount of output can exhaust memory. When
// the task's context ends (timeout, cancellation, lost claim), the process
// group gets SIGTERM, then SIGKILL after grace. The command gets
// DROVER_TASK_ID, DROVER_TASK_TYPE, DROVER_ATTEMPT, DROVER_CLAIM_TOKEN and
// DROVER_QUEUE in its environment (drover emit finds its stream there);
// its standard error goes to stderr, and the last 2 KiB of it to the
// task's error (not to its spans, which say how the command ended only).
//
// Under a worker a run is also a step of its task: DROVER_STEP says which,
// DROVER_STATE_FILE holds the state the step before printed, and a run
// that writes a sleep to DROVER_SLEEP_FILE and exits 0 has its output
// checkpointed and the task parked until the sleep ends (see Steps); the
// next run is the next step.
func ExecHandler(argv []string, maxOutput int, grace time.Duration, stderr *os.File) Handler {
	return ExecHandlerEnv(argv, nil, maxOutput, grace, stderr)
}

// ExecHandlerEnv is ExecHandler whose command also gets env
// ("NAME=value" each) in its environment, after the worker's own: the
// way to pass it what it needs (credentials too) without a command
// line that shows them, or errors that name a wrapper.
func ExecHandlerEnv(argv, env []string, maxOutput int, grace time.Duration, stderr *os.File) Handler {
	env = slices.Clone(env)
	if maxOutput <= 0 {
		maxOutput = DefaultMaxOutput
	}
	if grace <= 0 {
		grace = 5 * time.Second
	}
	return func(ctx context.Context, t *Task) ([]byte, error) {
		in, err := json.Marshal(t)
		if err != nil {
			return nil, Permanent(fmt.Errorf("encode task: %w", err))
		}
		step, err := prepareExecStep(ctx, t)
		if err != nil {
			return nil, err
		}
		defer step.cleanup()
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append(task.InheritedEnv(os.Environ()), "DROVER_TASK_ID="+t.ID, "DROVER_TASK_TYPE="+t.Type,
			"DROVER_ATTEMPT="+strconv.Itoa(t.Attempt), "DROVER_CLAIM_TOKEN="+strconv.FormatInt(t.Token, 10), "DROVER_QUEUE="+t.Queue)
		stream.Elsewhere(ctx) // the command may emit (drover emit)
		cmd.Env = append(append(cmd.Env, otelspan.Env(ctx)...), env...)
		cmd.Env = append(cmd.Env, step.env()...)
		cmd.Stdin = bytes.NewReader(in)
		out := &boundedBuffer{limit: maxOutput}
		tail := &tailBuffer{limit: 2048}
		cmd.Stdout = out
		if stderr != nil {
			cmd.Stderr = multiWriter{stderr, tail}
		} else {
			cmd.Stderr = tail
		}
		waitErr, stopped, startErr := proc.Supervise(cmd, nil, ctx.Done(), grace, nil)
		switch {
		case startErr != nil:
			return nil, Permanent(fmt.Errorf("start %s: %w", argv[0], startErr))
		case stopped:
			return nil, fmt.Errorf("%s stopped: %w", argv[0], context.Cause(ctx))
		case out.over:
			return nil, Permanent(fmt.Errorf("%s printed %d bytes, over the %d-byte result limit", argv[0], out.total, maxOutput))
		case waitErr == nil:
			return step.finish(ctx, t, out.Bytes())
		}
		var ee *exec.ExitError
		failed := &commandError{cmd: argv[0], err: waitErr, tail: string(bytes.TrimSpace(tail.Bytes()))}
		if errors.As(waitErr, &ee) {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && !ws.Signaled() && ws.ExitStatus() == ExitPermanent {
				return nil, Permanent(failed)
			}
		}
		return nil, failed
	}
}

// commandError is the failure of an exec handler's command: "<command>:
// <how it ended>: <the tail of its standard error>". Its spans carry it
// without the tail (otelspan.Texter), which may hold anything the command
// printed.
type commandError struct {
	cmd, tail string
	err       error
}

func (e *commandError) Error() string {
	if e.tail == "" {
		return e.SpanText()
	}
	return e.SpanText() + ": " + e.tail
}

// SpanText is the error without its stderr tail.
func (e *commandError) SpanText() string { return e.cmd + ": " + e.err.Error() }

func (e *commandError) Unwrap() error { return e.err }

// boundedBuffer keeps the first limit bytes written and counts the rest. It
// has no ReadFrom on purpose: io.Copy would use bytes.Buffer's, which reads
// everything into memory.
type boundedBuffer struct {
	buf   []byte
	limit int
	total int
	over  bool
}

func (b *boundedBuffer) Write(p []byte) (int, error) {
	b.total += len(p)
	if room := b.limit - len(b.buf); room < len(p) {
		b.over = true
		if room > 0 {
			b.buf = append(b.buf, p[:room]...)
		}
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Bytes returns what was kept.
func (b *boundedBuffer) Bytes() []byte { return b.buf }

// tailBuffer keeps the last limit bytes written.
type tailBuffer struct {
	buf   []byte
	limit int
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.buf = append(b.buf, p...)
	if len(b.buf) > b.limit {
		b.buf = append(b.buf[:0], b.buf[len(b.buf)-b.limit:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) Bytes() []byte { return b.buf }

type multiWriter struct {
	a *os.File
	b *tailBuffer
}

func (m multiWriter) Write(p []byte) (int, error) {
	_, _ = m.a.Write(p)
	return m.b.Write(p)
}

type claimKey struct{}

// claimFence is a running task's claim as a fence for writes made while
// handling it (see Steps).
type claimFence struct {
	w      *Worker
	c      *claim
	task   string                  // c's task id, read once: an abandoned handler's writes must not read c.task
	cancel context.CancelCauseFunc // ends the handler's context
	ctx    context.Context         // the claim's: ends with a cancel, the lease, or the attempt
	// gone says the attempt's handler returned or was given up on: set
	// before the attempt's outcome is written, it refuses every later
	// write through the fence (Err), whatever the claim key says: a
	// run's key stays while the run's other tasks run.
	gone atomic.Bool
}

var _ lease.Fence = (*claimFence)(nil)

// Txn starts a transaction that commits only while the claim is held.
func (f *claimFence) Txn(ctx context.Context) clientv3.Txn {
	cmps := f.Compares() // a task of a run: also not cancelled (its slot has no exit)
	return lease.NewFencedTxn(ctx, f.w.cli, lease.Spec{
		Name:  fmt.Sprintf("claim of task %s", f.task),
		Token: f.c.token,
		Cmp:   cmps[0],
		Also:  cmps[1:],
		Check: f.Err,
		Lost:  func(cause error) { f.cancel(fmt.Errorf("%w: claim lost: %w", lock.ErrLost, cause)) },
	})
}

// Token is the claim's fencing token.
func (f *claimFence) Token() int64 { return f.c.token }

// Context is cancelled when the claim ends: the task was cancelled, the
// worker's lease was lost, a write under the claim was refused, or the
// attempt is over.
func (f *claimFence) Context() context.Context { return f.ctx }

// Err reports the worker's lease loss, which ends every claim, the end
// of the attempt (its handler gone) and the end of the claim's context.
func (f *claimFence) Err() error {
	if err := f.w.lease.Err(); err != nil {
		return err
	}
	if f.gone.Load() {
		return errAttemptOver
	}
	if f.ctx.Err() != nil {
		return context.Cause(f.ctx)
	}
	return nil
}

// ClaimFence returns the claim of the task a handler runs, as a lease.Fence:
// writes made with its Txn commit only while the claim is held, and its
// Context ends when the claim does. It is nil outside a handler.
func ClaimFence(ctx context.Context) lease.Fence {
	if f, ok := ctx.Value(claimKey{}).(*claimFence); ok {
		return f
	}
	return nil
}

// Steps returns a handler that runs each task as agent steps, with the task
// runner's checkpoints (see package task): the first step gets the task's
// parameters, every step's checkpoint is written fenced by the task's claim,
// and an attempt that follows one that died (a worker killed, a claim lost)
// resumes after the last checkpointed step instead of starting over. The
// result is the last step's state. A step's error fails the attempt (and is
// retried like any handler error).
//
// A step that ends with task.Sleep or task.SleepUntil parks the task once
// its checkpoint is written: the claim is given up, the task is SLEEPING
// on the queue's due index (no worker slot, no lease, no goroutine holds
// it), and any worker of the queue resumes it at the next step when the
// sleep ends on the worker's clock. The sleep costs no attempt.
//
// A step that ends with task.WaitSignal parks the task the same way,
// WAITING, until a signal it waits for is sent (Client.Signal), which
// moves it back to pending at once, or until the wait's timeout; the next
// step gets the signal, or the timeout, through task.ReceivedSignal, and
// its checkpoint consumes the signal. The wait costs no attempt.
//
// A step that ends with task.Spawn spawns child tasks: their list is
// checkpointed with the step, then they are submitted (each once, with an
// id derived from the task and the step), and the task parks WAITING
// until enough of them ended; any worker of the queue then resumes it at
// the next step, which reads their outcomes with task.Children. A child
// that ends DEAD or CANCELLED fails the task (DEAD, not retried) unless
// the spawn collects every outcome. See docs/workflows.md.
func Steps(store *task.Store, steps ...task.Step) Handler {
	return func(ctx context.Context, t *Task) ([]byte, error) {
		f, ok := ctx.Value(claimKey{}).(*claimFence)
		if !ok {
			return nil, Permanent(errors.New("queue.Steps handler run outside a worker"))
		}
		res, err := store.RunSteps(ctx, f, t.ID, steps, task.StepConfig{Worker: f.w.worker, Initial: t.Parameters, Now: f.w.client.now,
			Spawner: childSpawner{c: f.w.client, q: f.w.cfg.Queue}, ClaimedAt: f.c.token})
		if err == nil && res.Waiting != nil {
			if beforeChildPark != nil && res.Waiting.Children != nil {
				beforeChildPark(t.ID)
			}
			return nil, &parked{until: waitDue(res.Waiting), wait: res.Waiting, again: res.StepsRun == 0}
		}
		if err == nil && !res.SleepingUntil.IsZero() {
			return nil, &parked{until: res.SleepingUntil, again: res.StepsRun == 0}
		}
		if err != nil {
			var tl *task.StateTooLargeError
			var bad *drover.InputError
			var cf *task.ChildFailedError
			if errors.As(err, &tl) || errors.Is(err, task.ErrStepsChanged) || errors.As(err, &bad) || errors.As(err, &cf) {
				return nil, Permanent(err)
			}
			return nil, err
		}
		return res.State, nil
	}
}
