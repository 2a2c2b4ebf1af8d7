package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Run claims and runs tasks until ctx ends (then it shuts down gracefully:
// no new claims, running tasks get ShutdownTimeout to finish and are then
// cancelled and handed back), the queue is drained (WorkerConfig.Drain), or
// the lease is lost (lease.ErrLost).
func (w *Worker) Run(ctx context.Context) error {
	w.lifeMu.Lock()
	if w.started {
		w.lifeMu.Unlock()
		return errors.New("queue: Run was called before; a worker runs once")
	}
	w.started = true
	w.lifeMu.Unlock()
	defer close(w.ran)
	ctx, endRun := context.WithCancel(ctx)
	defer endRun()
	w.ending = ctx.Done()
	go func() {
		select {
		case <-w.stopReq:
			endRun()
		case <-ctx.Done():
		}
	}()
	// Handlers run under the lease, not under ctx: ctx ending asks for a
	// graceful stop, the lease ending means the claims are gone.
	base, cancelBase := context.WithCancelCause(w.lease.Context())
	defer cancelBase(nil)

	// Two ackers, so one outcome request is in flight while the next
	// fills. Each run's outcomes go to one of them, in order: a run's
	// last batch deletes it.
	var outcomes [claimers]chan outcome
	var ackers sync.WaitGroup
	for i := range outcomes {
		outcomes[i] = make(chan outcome, w.cfg.Concurrency)
		ackers.Go(func() { w.acker(outcomes[i]) })
	}
	w.client.pauses.gauge(w.cfg.Queue)       // the worker's client sets its queue's drover_queue_paused (pause.go)
	_, _ = w.client.Paused(ctx, w.cfg.Queue) // a pause known before the first claim, and its gauge
	stopBG := w.startBackground(ctx, base)
	runErr := w.runLoops(ctx, base, outcomes)
	for _, ch := range outcomes {
		close(ch)
	}
	ackers.Wait()
	w.finishing.Wait() // the dones of the last outcomes (bounded: finishStreams)
	stopBG()
	if err := w.lease.Err(); err != nil && runErr == nil {
		runErr = fmt.Errorf("queue: worker %s: %w", w.worker, err)
	}
	return runErr
}

// startBackground starts the worker's background work under base: the
// watches of lost claims and of cancels, the moves of due retries and
// scheduled segments, the removal of expired tasks and the count of the
// queue's depth. The stop it returns ends them and waits for them.
func (w *Worker) startBackground(ctx, base context.Context) (stop func()) {
	// The watches start after the revision read here, before any claim:
	// a claim deleted (its lease revoked) or a cancel asked for before a
	// watch is set up is still seen, at once rather than at the lease's
	// next renewal.
	startRev := w.currentRevision(ctx)
	bg, stopBG := context.WithCancel(base)
	var bgWG sync.WaitGroup
	bgWG.Add(5)
	go func() { defer bgWG.Done(); w.watchOrphans(bg, startRev) }()
	go func() { defer bgWG.Done(); w.promoteDue(bg) }()
	go func() { defer bgWG.Done(); w.watchCancels(bg, startRev) }()
	go func() { defer bgWG.Done(); w.removeExpired(bg) }()
	go func() { defer bgWG.Done(); w.countDepth(bg) }()
	return func() {
		stopBG()
		bgWG.Wait()
	}
}

// runLoops runs the claim loops until the first ends (drained, lease
// lost, ctx ended), then lets the running tasks finish (see ShutdownTimeout in
// WorkerConfig) and returns the first loop's error. Handlers run under
// base; outcomes go to the ackers.
func (w *Worker) runLoops(ctx, base context.Context, outcomes [claimers]chan outcome) error {
	// Claimers run side by side so that one claim's round trips overlap
	// another's: a claim is two round trips (read, then the conditional
	// write), and one claimer at a time left the server waiting. The
	// overlap is for short tasks: the first claimer reserves up to
	// Prefetch free slots, so the second claims only while slots come free
	// during the first one's claim, or when Prefetch < Concurrency.
	// The pool holds Concurrency slots for running tasks and Prefetch more
	// for tasks claimed ahead, which wait for a running slot (run); the
	// ahead slots are held back while tasks take long (aheadHeld).
	slots := newSlotPool(w.cfg.Concurrency+w.cfg.Prefetch, w.cfg.Prefetch)
	run := make(chan struct{}, w.cfg.Concurrency)
	var tasks sync.WaitGroup
	// The first loop to end (drained, lease lost, ctx ended) ends them all.
	loopCtx, endLoops := context.WithCancel(ctx)
	defer endLoops()
	errs := make(chan error, claimers)
	for lane := range claimers {
		go func() {
			defer endLoops()
			errs <- w.loop(loopCtx, base, lane, slots, run, outcomes, &tasks)
		}()
	}
	var runErr error
	for range claimers {
		if err := <-errs; err != nil && runErr == nil {
			runErr = err
		}
	}
	w.finishTasks(base, &tasks)
	return runErr
}

// finishTasks waits for tasks, the running tasks, to finish, for at most
// the shutdown timeout; then it cancels them and hands them back, and
// waits for that. It waits no longer once base (the lease) ends.
func (w *Worker) finishTasks(base context.Context, tasks *sync.WaitGroup) {

	// Shutdown: let running tasks finish, then cancel and hand them back.
	allDone := make(chan struct{})
	go func() { tasks.Wait(); close(allDone) }()
	select {
	case <-allDone:
	case <-time.After(w.cfg.ShutdownTimeout):
		w.cancelAll(ErrShutdown)
		<-allDone
	case <-base.Done():
		<-allDone
	}
}

func (w *Worker) cancelAll(cause error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.inflight {
		r.cancel(cause)
	}
}

// stopping reports whether the worker stops: Run's ctx ended, Stop or
// StopAndCancel was called, or the lease ended. The process is about to
// end, so a handler that does not return is given up on whatever the
// number given up on already (runHandler).
func (w *Worker) stopping() bool {
	select {
	case <-w.stopReq:
	case <-w.ending:
	case <-w.lease.Context().Done():
	default:
		return false
	}
	return true
}

// Stop ends Run gracefully, as ctx ending does: no new claims, running tasks
// get ShutdownTimeout to finish and are then cancelled and handed back. It
// waits for Run to return, no longer than ctx allows. Called before Run, it
// makes Run return at once; it is safe to call more than once.
func (w *Worker) Stop(ctx context.Context) error {
	w.stopOnce.Do(func() { close(w.stopReq) })
	return w.waitRan(ctx)
}

// StopAndCancel ends Run at once: no new claims, and every running task's
// context is cancelled (cause ErrShutdown) and the task handed back, its
// attempt not counted. It waits for Run to return, no longer than ctx
// allows. It is safe to call before Run, after Stop, and more than once.
func (w *Worker) StopAndCancel(ctx context.Context) error {
	w.hardStop.Store(true)
	w.stopOnce.Do(func() { close(w.stopReq) })
	w.cancelAll(ErrShutdown)
	return w.waitRan(ctx)
}

// waitRan waits for Run to return, if it started.
func (w *Worker) waitRan(ctx context.Context) error {
	w.lifeMu.Lock()
	started := w.started
	w.lifeMu.Unlock()
	if !started {
		return nil
	}
	select {
	case <-w.ran:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("queue: stop worker %s: %w", w.worker, ctx.Err())
	}
}

// aheadBelow: tasks are claimed ahead of a free running slot while the
// worker's tasks take less than this on average (a claim's round trip,
// which waits for etcd's fsync, is then most of a task's time); longer
// tasks are not, so that a worker does not sit on tasks others could run.
const aheadBelow = 5 * time.Millisecond

// sample adds d to the running average avg (in ns; 0: no sample yet):
// the worker's task times and claim times.
func sample(avg *atomic.Int64, d time.Duration) {
	for {
		old := avg.Load()
		next := int64(d) // the first sample
		if old != 0 {
			next = old + (int64(d)-old)/8
		}
		if avg.CompareAndSwap(old, max(next, 1)) {
			return
		}
	}
}

// aheadFor returns how many tasks a worker of conc running slots claims
// ahead of a free slot when its tasks take task on average and its claims
// claim (task at least aheadBelow): what its slots finish during one
// claim's round trip, rounded down, at most prefetch. By Little's law a
// task so held waits about one claim's round trip for its slot, which is
// no longer than claiming it when the slot comes free would take.
func aheadFor(task, claim time.Duration, conc, prefetch int) int {
	if task <= 0 {
		return 0
	}
	return int(min(int64(prefetch), int64(conc)*int64(claim)/int64(task)))
}

// aheadHeld returns how many of the Prefetch slots for tasks claimed ahead
// are to be held back now. While the worker's tasks take less than
// aheadBelow on average and none of those running has run longer, none;
// for longer tasks, all but aheadFor's count, and all of them while a
// running task has run four times the average. All of them in a FIFO queue
// (tasks claimed ahead could start out of order) and before a task ended.
func (w *Worker) aheadHeld() int {
	if w.allAhead {
		return 0
	}
	avg := time.Duration(w.taskTime.Load())
	if w.sched.fifo.Load() || avg == 0 {
		return w.cfg.Prefetch
	}
	ahead, longer := w.cfg.Prefetch, aheadBelow
	if avg >= aheadBelow {
		ahead, longer = aheadFor(avg, time.Duration(w.claimTime.Load()), w.cfg.Concurrency, w.cfg.Prefetch), 4*avg
	}
	if ahead == 0 {
		return w.cfg.Prefetch
	}
	since := time.Now().Add(-longer)
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range w.inflight {
		if !r.started.IsZero() && r.started.Before(since) {
			return w.cfg.Prefetch
		}
	}
	return w.cfg.Prefetch - ahead
}

// startWhenFree runs claimed task c once a running slot is free. A task
// claimed ahead waits for one registered as in flight, so that a cancel,
// StopAndCancel, the shutdown timeout and the lease's end reach it; when
// the worker stops (stop ends) before it started, it is handed back, not
// started.
func (w *Worker) startWhenFree(stop, base context.Context, c *claim, run chan struct{}) outcome {
	select {
	case run <- struct{}{}:
	default:
		tctx, cancel := context.WithCancelCause(base)
		w.track(c, cancel, time.Time{})
		got := false
		select {
		case run <- struct{}{}:
			got = true
		case <-tctx.Done():
		case <-stop.Done():
			cancel(ErrShutdown)
		}
		w.untrack(c.task.ID)
		if tctx.Err() != nil {
			if got {
				<-run
			}
			if cause := context.Cause(tctx); errors.Is(cause, lock.ErrLost) {
				return outcome{c: c, kind: Cancelled, err: cause} // its claim is gone
			}
			return w.notAdmitted(tctx, base, c, context.Cause(tctx))
		}
		cancel(nil)
	}
	defer func() { <-run }()
	// The lease ended: the claims went with it. Its own check, not only
	// base's: a process woken from a pause past the TTL starts tasks
	// before the lease's renewal loop runs and cancels base, and the
	// check of the renewal deadline sees the loss at once.
	if err := w.lease.Err(); err != nil || base.Err() != nil {
		if base.Err() != nil {
			err = context.Cause(base)
		}
		return outcome{c: c, kind: Cancelled, err: err}
	}
	began := time.Now()
	actx, span := w.startAttempt(base, c)
	o := w.execute(actx, c)
	endAttempt(span, o)
	sample(&w.taskTime, time.Since(began))
	return o
}

// gatherFor is how long a claim loop waits for slots to come free before it
// claims fewer than half of Prefetch.
const gatherFor = 3 * time.Millisecond

// claimers is how many claim loops, and how many outcome writers, a worker
// runs at once.
const claimers = 2

// loop claims while there are free slots and waits on a watch when there is
// nothing to claim. Several loops share one slot pool.
func (w *Worker) loop(ctx, base context.Context, lane int, slots *slotPool, run chan struct{}, outcomes [claimers]chan outcome, tasks *sync.WaitGroup) error {
	var pausedTo int64 // the revision a wait while paused saw up to
	for {
		if ctx.Err() != nil {
			return nil
		}
		if base.Err() != nil {
			return context.Cause(base)
		}
		if rev := w.client.pauses.since(w.cfg.Queue); rev > 0 {
			if w.whilePaused(ctx, base, rev, slots, &pausedTo) {
				return nil
			}
			continue
		}
		// With tasks running, wait a moment for half a claim's worth of
		// slots: one claim then takes a batch.
		slots.hold(w.aheadHeld())
		slots.gather(max(1, w.cfg.Prefetch/2), gatherFor, ctx.Done())
		n, freed := slots.reserve(w.cfg.Prefetch)
		if n == 0 {
			select {
			case <-freed:
			case <-ctx.Done():
			case <-base.Done():
			}
			continue
		}
		began := time.Now()
		claims, rev, contended, err := w.sched.claim(ctx, lane, n)
		w.claimed(ctx, base, began, n, claims, err)
		slots.release(n - len(claims))
		if err != nil {
			if ctx.Err() != nil || base.Err() != nil {
				continue
			}
			w.logger.Warn("queue: claim failed; retrying", "queue", w.cfg.Queue, "err", err)
			select {
			case <-time.After(500 * time.Millisecond):
			case <-ctx.Done():
			case <-base.Done():
			}
			continue
		}
		for _, c := range claims {
			tasks.Add(1)
			go func() {
				defer tasks.Done()
				o := w.startWhenFree(ctx, base, c, run)
				outcomes[o.writer()] <- o
				slots.end()
			}()
		}
		if len(claims) > 0 {
			continue
		}
		if contended {
			// Tasks were there but other workers won them: try again
			// a little apart, or at once when something new comes
			// meanwhile.
			w.waitForWork(ctx, base, rev, nil, false, raceGap())
			continue
		}
		busy, ended := slots.state()
		if w.cfg.Drain && busy == 0 && w.drained(ctx) {
			return nil
		}
		if !w.cfg.Drain {
			// A task of this worker ending makes nothing claimable (its
			// outcome removes its pending key with its claim); only a
			// draining worker wakes for it, to see whether it is done.
			ended = nil
		}
		w.waitForWork(ctx, base, rev, ended, busy == 0, 0)
	}
}

// drained reports whether nothing of the worker's queue is left to do
// (WorkerConfig.Drain): see Client.drained; it closes finished segments
// first.
func (w *Worker) drained(ctx context.Context) bool {
	_, _ = w.client.closeFinished(ctx, w.cfg.Queue)
	return w.client.drained(ctx, w.cfg.Queue)
}

// whilePaused waits while the worker's queue is known paused (since
// revision rev) for the resume: no claim until then (30 s: a safety net).
// A draining worker checks first whether it is done (true: Run returns),
// and wakes when a task ends to check again: one of its own, or, with
// none running, anyone's. An empty paused queue is drained; one with
// tasks waiting keeps a draining worker until the resume. *at is the
// revision the last such wait saw up to, from which the next one goes on.
func (w *Worker) whilePaused(ctx, base context.Context, rev int64, slots *slotPool, at *int64) (done bool) {
	o := resumeWait{stop: base.Done()}
	if w.cfg.Drain {
		busy, ended := slots.state()
		if busy == 0 && w.drained(ctx) {
			return true
		}
		o.ended, o.anyEnd = ended, busy == 0
	}
	_, *at = w.client.awaitResume(ctx, w.cfg.Queue, max(rev, *at), 30*time.Second, o)
	return false
}

// waitForWork blocks until something may have become claimable: a pending
// key created (a new, retried or requeued task), a claim deleted without its
// pending key (a dead worker's or handed-back task), a task of this worker
// ended, or, when draining, any claim deleted. It sees every event after
// rev, the revision the last (empty) claim read, through the queue's shared
// watch (watchhub.go), so nothing that happened since is missed (the watch
// logs its own errors). It waits at most most (0: a safety net of 30 s), or
// until ctx or base ends.
func (w *Worker) waitForWork(ctx, base context.Context, rev int64, ended <-chan struct{}, idle bool, most time.Duration) {
	wt := w.sched.waitAfterClaim(rev)
	defer wt.Stop()
	// A safety net, not the mechanism; and, while tasks are left out of
	// claims because a task runner held them, the moment they are tried
	// again: a runner letting a task go changes nothing in the queue.
	d := w.sched.runnerHeldWait(30 * time.Second)
	if most > 0 {
		d = min(d, most)
	}
	fallback := time.NewTimer(d)
	defer fallback.Stop()
	for {
		select {
		case <-wt.C():
			evs, missed := wt.Take()
			// The events are taken in even after a miss: the window and
			// the busy marks learn of them, and no wait replays them.
			if woke := w.sched.wakes(evs, idle && w.cfg.Drain); missed || woke {
				return
			}
		case <-ended:
			return
		case <-fallback.C:
			return
		case <-ctx.Done():
			return
		case <-base.Done():
			return
		}
	}
}

// wakes reports whether events may have made something claimable (a
// segment or task created, a dead worker's claims deleted), and tells the
// open window of every segment created (openWindow.created).
func (w *claimer) wakes(events []*clientv3.Event, anyClaimDelete bool) bool {
	q := w.queue
	pre, claims := w.keys.QueuePending(q), w.keys.QueueClaims(q)
	pendingDeleted := map[string]int64{}
	open := w.keys.SegmentsOpen(q)
	resumed := false
	for _, ev := range events {
		k := string(ev.Kv.Key)
		resumed = w.client.sawEvent(q, ev) || resumed // a pause or a resume (pause.go)
		if seg, ok := keyspace.OpenSegmentName(open, k); ok && ev.Type == clientv3.EventTypePut && ev.IsCreate() {
			w.levelMu.Lock()
			w.opened(seg, ev.Kv.ModRevision)
			w.levelMu.Unlock()
		}
		if ev.Type == clientv3.EventTypeDelete && strings.HasPrefix(k, pre) {
			pendingDeleted[pendingID(k, pre)] = ev.Kv.ModRevision
		}
	}
	tries := map[string]int64{} // a run's name → the revision its try was deleted
	for _, ev := range events {
		if seg, rest, ok := keyspace.SegmentPart(w.keys.Tries(q, ""), string(ev.Kv.Key)); ok && ev.Type == clientv3.EventTypeDelete {
			tries[seg+"/"+rest] = ev.Kv.ModRevision
		}
	}
	woke := resumed
	for _, ev := range events {
		k := string(ev.Kv.Key)
		if seg, rest, ok := keyspace.SegmentPart(w.keys.Runs(q, ""), k); ok && ev.Type == clientv3.EventTypeDelete {
			// A run deleted without its try: a dead worker's tasks. Its
			// segment may be marked busy (all its slots were running):
			// the claim this wakes must try it.
			if rev, ok := tries[seg+"/"+rest]; anyClaimDelete || !ok || rev != ev.Kv.ModRevision {
				w.unmarkBusy(seg)
				woke = true
			}
			continue
		}
		if woke {
			continue
		}
		switch {
		case ev.Type == clientv3.EventTypePut && ev.IsCreate() && (strings.HasPrefix(k, pre) || strings.HasPrefix(k, open)):
			return true
		case ev.Type == clientv3.EventTypeDelete && strings.HasPrefix(k, claims):
			if anyClaimDelete {
				return true
			}
			id, _ := keyspace.Last(claims, k)
			if rev, ok := pendingDeleted[id]; !ok || rev != ev.Kv.ModRevision {
				return true
			}
		}
	}
	return woke
}
