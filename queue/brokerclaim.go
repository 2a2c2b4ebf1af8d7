package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// External workers: a worker outside this process (an HTTP client of
// package httpapi) claims tasks with Claim under a lease it keeps alive
// itself, runs them, and reports each with Ack or Fail, naming the claim by
// what Claim returned (the task's id and its token). The claims are the
// Worker's own: the same transactions, bound to the lease, fenced by the
// token, attempts counted durably; so a worker whose lease expires loses
// its claims within the TTL, and an outcome it sends later is refused with
// an error matching lease.ErrFenced.

// MaxClaim is the most tasks one Claim takes.
const MaxClaim = 100

// ClaimRequest says who claims and how many.
type ClaimRequest struct {
	// Lease binds the claims (required): when it ends, etcd deletes them
	// and the tasks run again elsewhere. The caller keeps it alive (an
	// attached lease, lease.Attach, for an HTTP session).
	Lease *lease.Lease
	// Worker names the claimer in the claims and the tasks' history.
	Worker string
	// Max is the most tasks claimed: 1 to MaxClaim; 0 means 1. A claim
	// fills up to Max across the queue's segments (one per submission).
	Max int
	// Wait is how long Claim waits for a claimable task when there is
	// none: it watches the queue, it does not poll. 0 makes one attempt.
	Wait time.Duration
	// Once, with no Wait, returns what the first attempt claimed: no
	// second attempt after claimers elsewhere won the tasks it found (by
	// default it tries a few times, a little apart). For a claim sent
	// along with other work, whose caller claims again anyway.
	Once bool
	// Logger receives the queue's warnings; default slog.Default().
	Logger *slog.Logger
}

// Held names a claim by what Claim returned: the queue, the task's id and
// the claim's token; Lease, when not 0, must be the lease the task was
// claimed under. Claims combined into one request (see below)
// share their token, each in a segment of its own: a token names a claim
// together with the task, and Lease binds it to its session.
type Held struct {
	Queue string
	ID    string
	Token int64
	Lease clientv3.LeaseID
}

// check validates h's names.
func (h Held) check() error {
	if err := CheckQueue(h.Queue); err != nil {
		return err
	}
	if err := keyspace.CheckName("task id", h.ID); err != nil {
		return err
	}
	if h.Token <= 0 {
		return &drover.InputError{Field: "token", Value: h.Token, Rule: "must be the token the claim returned"}
	}
	return nil
}

// outcomeWorker is a worker of queue q that writes outcomes of the claims
// of an external worker named worker, with a Worker's own writes (and its
// default backoff). It never runs nor claims: its state lasts one call.
func (b *broker) outcomeWorker(q, worker string) *Worker {
	c := b.client
	cfg := WorkerConfig{Queue: q, Concurrency: 1, Prefetch: 1, BackoffBase: time.Second, BackoffMax: 5 * time.Minute}
	return newWorker(c, cfg, nil, worker, slog.Default())
}

// Claim claims up to req.Max tasks of queue q under req.Lease, waiting up
// to req.Wait for one when none is claimable. Each task comes back RUNNING
// with its Attempt and its Token: the fencing token that Heartbeat, Ack and
// Fail need. Retries that fell due are moved back to pending first (no
// Worker may be running to do it). No task (and no error) means none came
// within the wait.
func (c *Client) Claim(ctx context.Context, q string, req ClaimRequest) ([]*Task, error) {
	if err := checkClaim(q, req); err != nil {
		return nil, err
	}
	n, deadline := max(req.Max, 1), time.Now().Add(req.Wait)
	w, sc, done := c.remote.sessionClaimer(q, req)
	defer done()
	// lead: it leads its queue's line of waiting claims (broker.go); full:
	// it took all it asked for; waited: it found nothing and waited, so
	// what woke it is new work the line shares: no topping up (fill).
	lead, full, waited := false, false, false
	defer func() {
		if lead {
			c.remote.waits.leave(q, full)
		}
	}()
	for raced, turn := 0, true; ; {
		if tasks, stop, err := c.whilePaused(ctx, q, deadline, &lead); stop {
			return tasks, err
		}
		claims, rev, contended, due, err := c.remote.claimOnce(ctx, w, q, n, turn)
		turn = false
		if err != nil {
			return nil, err
		}
		tasks, err := c.remote.runnable(ctx, w, claims, req.Lease.ID())
		if err != nil || len(tasks) > 0 {
			if err == nil {
				c.remote.claims.remember(func(seg string) string { return c.keys.Runs(q, seg) }, q, claims, tasks, req.Lease.ID())
				if !waited {
					tasks = c.remote.fill(ctx, w, q, n, claims, tasks, req.Lease.ID())
				}
				full = len(tasks) >= n
			}
			return tasks, err
		}
		if seg, _ := w.hotSegment(0); sc.hot != "" && len(claims) == 0 && seg == "" {
			sc.hot = "" // the session's segment had nothing left: claim again at once, from the list
			continue
		}
		left := time.Until(deadline)
		switch {
		case ctx.Err() != nil:
			return nil, fmt.Errorf("queue: claim from %s: %w", q, ctx.Err())
		case len(claims) > 0:
			continue // every one was given up on: claim again
		case contended && left <= 0 && raced < 10 && !req.Once:
			// Tasks were there but others won them: again, a little
			// apart, a few times even without a wait.
			raced++
			afterLostRace(ctx)
			continue
		case left <= 0:
			return []*Task{}, nil
		}
		waited = true
		if !lead {
			// It waits: behind the claim that leads the line, if one does.
			var inLine, ok bool
			if lead, inLine, ok = c.remote.waits.join(ctx, q, deadline); !ok {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("queue: claim from %s: %w", q, ctx.Err())
				}
				return []*Task{}, nil
			}
			if inLine {
				w.forgetBusy() // runs may have ended meanwhile: the leader saw them, not this claim
				turn = !lead   // woken with the whole line: claim together
				continue
			}
		}
		if contended {
			// Others won the tasks it saw: again a little apart, or at
			// once when something new comes meanwhile.
			raced++
			left = min(left, raceGap())
		}
		w.awaitWork(ctx, rev, left, due)
	}
}

// whilePaused holds a claim of queue q while q is known paused (pause.go),
// out of the line of waiting claims (it leaves it if it led it: *lead),
// until the resume or the deadline; stop: the claim ends with tasks (none)
// and err. A claim whose time runs out (or that has none: Wait 0) reads
// the pause key once before it answers nothing: what this Client knows of
// the pause may be stale (a resume made elsewhere, which the wait had no
// time to see), and a claim that never tried would never correct it.
func (c *Client) whilePaused(ctx context.Context, q string, deadline time.Time, lead *bool) (tasks []*Task, stop bool, err error) {
	rev := c.pauses.since(q)
	if rev == 0 {
		return nil, false, nil
	}
	if *lead {
		c.remote.waits.leave(q, false)
		*lead = false
	}
	if resumed, _ := c.awaitResume(ctx, q, rev, time.Until(deadline), resumeWait{}); resumed {
		return nil, false, nil
	}
	if ctx.Err() != nil {
		return nil, true, fmt.Errorf("queue: claim from %s: %w", q, ctx.Err())
	}
	st, err := c.Paused(ctx, q)
	if err != nil {
		return nil, true, fmt.Errorf("queue: claim from %s: %w", q, err)
	}
	if !st.Paused {
		return nil, false, nil // resumed: claim
	}
	return []*Task{}, true, nil
}

// claimOnce moves queue q's due retries back to pending (when due,
// promoteDue) and makes one claim of up to n tasks with w: combined with
// the claims that arrive meanwhile when turn is set (claimTurn), else
// alone. due is when the next known retry falls due.
func (b *broker) claimOnce(ctx context.Context, w *claimer, q string, n int, turn bool) (claims []*claim, rev int64, contended bool, due time.Time, err error) {
	due, err = b.promoteDue(ctx, w, q)
	if err != nil {
		return nil, 0, false, due, fmt.Errorf("queue: claim from %s: move due retries: %w", q, err)
	}
	b.attempts.Add(1)
	if turn {
		claims, rev, contended, err = b.claimTurn(ctx, w, q, n)
	} else {
		claims, rev, contended, err = w.claim(ctx, 0, n)
	}
	if err != nil {
		return nil, 0, false, due, fmt.Errorf("queue: claim from %s: %w", q, err)
	}
	return claims, rev, contended, due, nil
}

// checkClaim checks the queue q and the request req of a Claim.
func checkClaim(q string, req ClaimRequest) error {
	if err := CheckQueue(q); err != nil {
		return err
	}
	if req.Max < 0 || req.Max > MaxClaim {
		return &drover.InputError{Field: "max", Value: req.Max, Rule: fmt.Sprintf("must be between 1 and %d", MaxClaim)}
	}
	if req.Lease == nil || req.Lease.ID() == clientv3.NoLease {
		return &drover.InputError{Field: "lease", Rule: "is required: the claims are bound to it"}
	}
	if req.Wait < 0 {
		return &drover.InputError{Field: "wait", Value: req.Wait, Rule: "must not be negative"}
	}
	return nil
}

// sessionClaimer is the claimer that makes one external claim of queue q,
// with what the claims of the Client and of req's session left it; done
// keeps what the claim leaves for the next. It claims as a Worker's claim
// loop does: the same claimer, as its lane 0.
func (b *broker) sessionClaimer(q string, req ClaimRequest) (w *claimer, sc sessionClaims, done func()) {
	c := b.client
	logger := req.Logger
	if logger == nil {
		logger = slog.Default()
	}
	w = newClaimer(c, q, req.Lease, req.Worker, logger)
	// The claims of all sessions take turns: each starts at another open
	// segment, and every eighth takes a lower priority level's (see
	// levelTurns); each session goes on with the segment it took from last.
	turn := b.turns.Add(1)
	w.spread = turn
	w.claimSeq.Store(int64(turn % (1 << 62)))
	w.turnSeq.Store(int64(turn % (1 << 62)))
	w.turns, w.window = b.levelTurnsOf(q), b.windowOf(q)
	lid := int64(req.Lease.ID())
	sc = b.sessionOf(q, lid)
	w.hot[0], w.predicted[0] = sc.hot, sc.st
	w.laneClaims[0].Store(sc.claims)
	return w, sc, func() {
		// A FIFO queue's claims all take its oldest segment: a session
		// keeps none of its own (a kept one would make the next claim skip
		// the open list and find nothing). Nor does it keep a guess at the
		// next segment: its next claim lists the open segments.
		seg, guessed := w.hotSegment(0)
		if w.fifo.Load() || guessed {
			seg = ""
		}
		w.levelMu.Lock()
		lt, ow, st := w.turns, w.window, w.predicted[0]
		w.levelMu.Unlock()
		b.setLevelTurns(q, lt)
		b.setWindow(q, ow)
		b.setSession(q, lid, sessionClaims{hot: seg, st: st, claims: w.laneClaims[0].Load()})
	}
}

// runnable returns the tasks of claims that may run: a task past its
// retry budget (its workers died or lost their claims) or whose record is
// unreadable goes to the dead-letter queue here, as a Worker would send it.
func (b *broker) runnable(ctx context.Context, w *claimer, claims []*claim, l clientv3.LeaseID) ([]*Task, error) {
	out := make([]*Task, 0, len(claims))
	for _, cl := range claims {
		t := cl.task
		var why error
		switch {
		case cl.broken != nil:
			why = Permanent(cl.broken)
		case t.Attempt > t.Retries()+1:
			why = fmt.Errorf("gave up after %d attempts: the worker running it died or lost its claim", t.Attempt-1)
		default:
			out = append(out, t)
			continue
		}
		var err error
		if cl.run == nil {
			_, err = b.outcomeWorker(w.queue, w.worker).writeOutcome(ctx, outcome{c: cl, kind: Dead, err: why}, nil)
		} else {
			_, err = b.settle(ctx, Held{Queue: t.Queue, ID: t.ID, Token: cl.token, Lease: l}, "give up on", func(*Worker, *claim) (outcome, error) {
				return outcome{kind: Dead, err: why}, nil
			})
		}
		if err != nil && !errors.Is(err, lease.ErrFenced) {
			w.logger.Warn("queue: could not send a task past its retry budget to the dead-letter queue", "task", t.ID, "err", err)
		}
	}
	return out, nil
}

// Claims of one queue that external workers (the HTTP API's sessions, each
// with its own request) make at the same time are combined, as their
// outcomes are (brokerreport.go). A claim that arrives while none of its
// queue is being made claims alone, as a Worker's claim loop does; the
// claims that arrive meanwhile wait, and the first of them then claims for
// all of them at once (up to combineMax): one read of the queue's levels
// and open segments, one read of the states of as many open segments as
// there are claims, and one request that writes each claim's run in a
// segment of its own, each as a nested transaction bound to its own
// session's lease and fenced exactly as a claim alone is. So the runs of
// one combined claim share a create revision (their tokens) but never a
// segment, and a segment's outcome keys, which start with the token, stay
// apart. A claim the combined one could not serve (fewer open segments
// than claims, a refused write, a segment with nothing free) goes on
// alone, as before. Nothing waits for a timer: a claim that arrives alone
// is made at once (group commit).

// combineMax is the most claims one combined claim serves: the states of
// that many segments (five or six reads each) fit etcd's 128 operations a
// request.
const combineMax = 16

// claimCombineTimeout bounds a combined claim: it is not cut short by one
// caller's context, since it claims for the others too.
const claimCombineTimeout = 10 * time.Second

// claimCombiner queues, per queue, the claims of one Client that wait for
// the one being made. The zero value is ready.
type claimCombiner struct {
	mu     sync.Mutex
	queues map[string]*claimLine
	// rounds counts the combined claims made, served the claims they
	// served with tasks.
	rounds, served atomic.Int64
}

// claimLine is the claims of one queue: whether one is being made, and
// those waiting for it.
type claimLine struct {
	busy    bool
	waiting []*claimCall
}

// claimCall is one claim waiting: its claimer (bound to its session's
// lease) and how many tasks it wants; its claims once made, and done,
// closed when they are there or when the call is to make the next combined
// claim itself (lead).
type claimCall struct {
	w      *claimer
	n      int
	claims []*claim
	lead   bool
	done   chan struct{}
}

// claimTurn is one claim of up to n tasks of queue q for w: alone when no
// other claim of q is being made, else combined with the others that
// arrive meanwhile; a claim the combined one did not serve is made alone.
func (b *broker) claimTurn(ctx context.Context, w *claimer, q string, n int) (claims []*claim, rev int64, contended bool, err error) {
	cc := &b.claimers
	call := &claimCall{w: w, n: n, done: make(chan struct{})}
	cc.mu.Lock()
	if cc.queues == nil {
		cc.queues = map[string]*claimLine{}
	}
	line := cc.queues[q]
	if line == nil {
		line = &claimLine{}
		cc.queues[q] = line
	}
	if !line.busy {
		line.busy = true
		cc.mu.Unlock()
		defer cc.handOn(q)
		return w.claim(ctx, 0, n)
	}
	line.waiting = append(line.waiting, call)
	cc.mu.Unlock()
	if err := cc.await(ctx, line, call); err != nil {
		return nil, 0, false, err
	}
	if call.lead {
		batch := cc.take(q)
		if len(batch) == 1 {
			cc.handOn(q)
			return w.claim(ctx, 0, n)
		}
		func() {
			defer cc.handOn(q) // even if the claim panics: the line must move on
			b.claimTogether(ctx, q, batch)
		}()
	}
	if len(call.claims) > 0 {
		return call.claims, 0, false, nil
	}
	return w.claim(ctx, 0, n)
}

// await waits for call's turn: until the maker answers it, once its claim
// (alone or combined) is made. When ctx ends first and call is still only
// waiting, it leaves the line with ctx's error; a call already taken into
// a combined claim, or made the next maker, goes on waiting: a combined
// claim answers within claimCombineTimeout, and a run made for a call that
// left would stay claimed until its session ended.
func (cc *claimCombiner) await(ctx context.Context, line *claimLine, call *claimCall) error {
	select {
	case <-call.done:
		return nil
	case <-ctx.Done():
	}
	cc.mu.Lock()
	if i := slices.Index(line.waiting, call); i >= 0 && !call.lead {
		line.waiting = slices.Delete(line.waiting, i, i+1)
		cc.mu.Unlock()
		return ctx.Err()
	}
	cc.mu.Unlock()
	<-call.done
	return nil
}

// take removes from queue q's waiting claims those the next combined
// claim serves: the first combineMax.
func (cc *claimCombiner) take(q string) []*claimCall {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	line := cc.queues[q]
	k := min(len(line.waiting), combineMax)
	batch := line.waiting[:k:k]
	line.waiting = line.waiting[k:]
	return batch
}

// handOn makes the first claim waiting for queue q the maker of the next
// combined claim, or ends the making when none waits.
func (cc *claimCombiner) handOn(q string) {
	cc.mu.Lock()
	defer cc.mu.Unlock()
	line := cc.queues[q]
	if len(line.waiting) == 0 {
		delete(cc.queues, q) // busy no more; the map keeps only queues being claimed from
		return
	}
	next := line.waiting[0]
	next.lead = true
	close(next.done)
}

// claimTogether makes one combined claim for batch (see above) and
// answers every call of it but the first, which made it.
func (b *broker) claimTogether(ctx context.Context, q string, batch []*claimCall) {
	c := b.client
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCombineTimeout)
	all := batch
	defer func() {
		cancel()
		for _, call := range all[1:] {
			close(call.done)
		}
	}()
	lead := batch[0].w
	levels, fifo, first, open, _, err := lead.readLevels(rctx, batch[0].n, "", true)
	if err != nil || len(levels) > 0 || fifo {
		// Tasks with records of their own go first, and a FIFO queue's
		// claims all take its oldest segment: each claims alone.
		return
	}
	lead.pickN = len(batch)
	names, err := lead.pickSegments(rctx, open, false, first != nil && first.bounded, lead.turnSeq.Load()+1)
	if err != nil || len(names) == 0 {
		return
	}
	batch = batch[:min(len(batch), len(names))]
	states, tss, err := c.readStates(rctx, q, names[:len(batch)])
	if err != nil {
		return
	}
	var ops []clientv3.Op
	var runs []*runClaim
	for i, call := range batch {
		if rc := b.planRun(rctx, call, states[i], tss[i]); rc != nil {
			ops = append(ops, rc.op())
			runs = append(runs, rc)
		}
	}
	if len(ops) == 0 {
		return
	}
	resp, err := c.cli.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		if outcomeUnknown(err) {
			// Its answer lost: each run may have been made.
			for _, rc := range runs {
				rc.call.claims = rc.resolve()
			}
		}
		return // (refused, as when one session's lease is gone: each claims alone)
	}
	b.claimers.rounds.Add(1)
	for k, rc := range runs {
		made, runnerHeld := rc.result(resp.Responses[k].GetResponseTxn())
		if runnerHeld {
			rc.findRunners(rctx)
		}
		if !made {
			continue
		}
		call := rc.call
		call.claims = rc.claimed(resp.Header.Revision)
		b.claimers.served.Add(1)
		if free := len(rc.free); free > len(rc.pick) {
			call.w.setPredicted(0, rc.st.after(call.claims[0].run, c.keys.Runs(q, rc.st.name), rc.pick))
		} else {
			call.w.setHot(0, "")
		}
	}
}

// planRun is the run that claims call's tasks from segment st (whose
// tasks are ts), nil when it has none free for it. A finished segment
// found open is closed.
func (b *broker) planRun(ctx context.Context, call *claimCall, st *segState, ts []Task) *runClaim {
	c := b.client
	if ts == nil || !st.open || st.unreadable > 0 {
		return nil
	}
	free := call.w.withoutRunnerHeldSlots(ts, st.free())
	if len(free) == 0 {
		if st.done() {
			c.closeSegment(ctx, call.w.queue, st)
		}
		return nil
	}
	// A dead worker's tasks first: they have waited longest.
	sort.SliceStable(free, func(i, j int) bool { return st.attempts(free[i]) > st.attempts(free[j]) })
	pick := free[:min(call.n, len(free))]
	rc := call.w.prepareRun(st, ts, pick, len(free)-len(pick) < 2*call.n)
	rc.call, rc.free = call, free
	return rc
}
