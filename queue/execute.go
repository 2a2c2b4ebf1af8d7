package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync"
	"time"

	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
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
func (w *Worker) execute(base context.Context, c *claim) outcome {
	t := c.task
	if c.broken != nil {
		return outcome{c: c, kind: Dead, err: Permanent(c.broken)}
	}
	if t.Attempt > t.Retries()+1 {
		return outcome{c: c, kind: Dead, err: fmt.Errorf("gave up after %d attempts: the worker running it died or lost its claim", t.Attempt-1)}
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
	hctx := context.WithValue(tctx, claimKey{}, &claimFence{w: w, c: c, cancel: cancel, ctx: ctx})
	began := time.Now()
	result, err := call(hctx, h, t)
	for _, d := range dones {
		d(err)
	}
	outcomeLabel := "succeeded"
	if err != nil {
		outcomeLabel = "failed"
	}
	metrics.TaskDuration.WithLabelValues(t.Queue, t.Type, outcomeLabel).Observe(time.Since(began).Seconds())
	cause := context.Cause(tctx)
	switch {
	case err == nil && len(result) > MaxResult:
		return outcome{c: c, kind: Dead, err: Permanent(fmt.Errorf("%w: %d bytes, over %d", ErrResultLarge, len(result), MaxResult))}
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
	if errors.Is(cause, ErrTimeout) && !errors.Is(err, ErrTimeout) {
		err = fmt.Errorf("%w after %s: %w", ErrTimeout, timeout, err)
	}
	if errors.Is(err, ErrPermanent) || t.Attempt > t.Retries() {
		return outcome{c: c, kind: Dead, err: err}
	}
	return outcome{c: c, kind: Retrying, err: err, delay: w.backoff(t)}
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
