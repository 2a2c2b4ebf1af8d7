package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
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
	// Max is the most tasks claimed: 1 to MaxClaim; 0 means 1.
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
// claimed under. Claims combined into one request (see claimcombine.go)
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
func (c *Client) outcomeWorker(q, worker string) *Worker {
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
	n := max(req.Max, 1)
	w, sc, done := c.sessionClaimer(q, req)
	defer done()
	deadline := time.Now().Add(req.Wait)
	// lead: this claim leads its queue's line of waiting claims
	// (claimwait.go); full: it took all it asked for.
	lead, full := false, false
	defer func() {
		if lead {
			c.remote.waits.leave(q, full)
		}
	}()
	for raced, turn := 0, true; ; {
		due, err := c.promoteDue(ctx, w, q)
		if err != nil {
			return nil, fmt.Errorf("queue: claim from %s: move due retries: %w", q, err)
		}
		var claims []*claim
		var rev int64
		var contended bool
		c.remote.attempts.Add(1)
		if turn {
			claims, rev, contended, err = c.claimTurn(ctx, w, q, n)
		} else {
			claims, rev, contended, err = w.claim(ctx, 0, n)
		}
		turn = false
		if err != nil {
			return nil, fmt.Errorf("queue: claim from %s: %w", q, err)
		}
		tasks, err := c.runnable(ctx, w, claims, req.Lease.ID())
		if err != nil || len(tasks) > 0 {
			if err == nil {
				c.remote.claims.remember(func(seg string) string { return c.keys.Runs(q, seg) }, q, claims, tasks, req.Lease.ID())
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
		if !lead {
			// It waits: behind the claim that leads the line, if one does.
			var waited, ok bool
			if lead, waited, ok = c.remote.waits.join(ctx, q, deadline); !ok {
				if ctx.Err() != nil {
					return nil, fmt.Errorf("queue: claim from %s: %w", q, ctx.Err())
				}
				return []*Task{}, nil
			}
			if waited {
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
func (c *Client) sessionClaimer(q string, req ClaimRequest) (w *claimer, sc sessionClaims, done func()) {
	logger := req.Logger
	if logger == nil {
		logger = slog.Default()
	}
	w = newClaimer(c, q, req.Lease, req.Worker, logger)
	// The claims of all sessions take turns: each starts at another open
	// segment, and every eighth takes a lower priority level's (see
	// levelTurns); each session goes on with the segment it took from last.
	turn := c.remote.turns.Add(1)
	w.spread = turn
	w.claimSeq.Store(int64(turn % (1 << 62)))
	w.turnSeq.Store(int64(turn % (1 << 62)))
	w.turns, w.window = c.levelTurnsOf(q), c.windowOf(q)
	lid := int64(req.Lease.ID())
	sc = c.sessionOf(q, lid)
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
		c.setLevelTurns(q, lt)
		c.setWindow(q, ow)
		c.setSession(q, lid, sessionClaims{hot: seg, st: st, claims: w.laneClaims[0].Load()})
	}
}

// runnable returns the tasks of claims that may run: a task past its
// retry budget (its workers died or lost their claims) or whose record is
// unreadable goes to the dead-letter queue here, as a Worker would send it.
func (c *Client) runnable(ctx context.Context, w *claimer, claims []*claim, l clientv3.LeaseID) ([]*Task, error) {
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
			_, err = c.outcomeWorker(w.queue, w.worker).writeOutcome(ctx, outcome{c: cl, kind: Dead, err: why}, nil)
		} else {
			_, err = c.settle(ctx, Held{Queue: t.Queue, ID: t.ID, Token: cl.token, Lease: l}, "give up on", func(*Worker, *claim) (outcome, error) {
				return outcome{kind: Dead, err: why}, nil
			})
		}
		if err != nil && !errors.Is(err, lease.ErrFenced) {
			w.logger.Warn("queue: could not send a task past its retry budget to the dead-letter queue", "task", t.ID, "err", err)
		}
	}
	return out, nil
}

// awaitWork blocks for at most d, and not past due (when a known retry
// falls due), until something may have become claimable in the queue after
// revision rev (see waitForWork), or a retry was scheduled (it may fall due
// before d ends).
func (w *claimer) awaitWork(ctx context.Context, rev int64, d time.Duration, due time.Time) {
	if !due.IsZero() {
		d = min(d, time.Until(due)+time.Millisecond)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	q := w.queue
	wt := w.client.waitAfter(q, rev)
	defer wt.Stop()
	retries := w.keys.QueueRetry(q)
	for {
		select {
		case <-wt.C():
			evs, missed := wt.Take()
			if missed || w.wakes(evs, false) {
				return
			}
			for _, ev := range evs {
				if ev.Type == clientv3.EventTypePut && ev.IsCreate() && strings.HasPrefix(string(ev.Kv.Key), retries) {
					// A retry scheduled (perhaps by another process): the
					// next claim moves it back when it falls due, rather
					// than after its promotion interval.
					if at, _, ok := keyspace.ParseTimedKey(retries, string(ev.Kv.Key)); ok {
						w.client.retryAt(q, time.Unix(0, at))
					}
					return
				}
			}
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Heartbeat checks that the claim h still holds, and returns its task,
// RUNNING. An error matching lease.ErrFenced says it does not: the lease
// ended, the task was cancelled, or its outcome was written.
func (c *Client) Heartbeat(ctx context.Context, h Held) (*Task, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	_, cl, _, err := c.held(ctx, h)
	if err != nil {
		return nil, err
	}
	return cl.task, nil
}

// Ack records that the claimed task h succeeded with result (at most
// MaxResult bytes), and returns it, SUCCEEDED. An error matching
// lease.ErrFenced says the claim no longer holds and nothing was written.
func (c *Client) Ack(ctx context.Context, h Held, result []byte) (*Task, error) {
	return c.reportOne(ctx, Outcome{Held: h, Result: result})
}

// Fail records that the claimed task h failed with reason: a permanent
// failure, or a transient one past the task's retry budget, sends it to
// the dead-letter queue; a transient one schedules a retry after the
// task's backoff (full jitter; a Worker's defaults, 1 s and 5 m, unless the
// task sets its own). It returns the task, RETRYING (with ScheduledAt) or
// DEAD. An error matching lease.ErrFenced says the claim no longer holds
// and nothing was written.
func (c *Client) Fail(ctx context.Context, h Held, reason string, permanent bool) (*Task, error) {
	return c.reportOne(ctx, Outcome{Held: h, Failed: true, Error: reason, Permanent: permanent})
}

// Release hands the claimed task h back: it is PENDING again, claimable at
// once, and the attempt does not count. It is for a claim whose caller will
// not run the task (the HTTP API releases the tasks of a claim whose client
// left before the answer was written). It returns the task, PENDING. An
// error matching lease.ErrFenced says the claim no longer holds and nothing
// was written.
func (c *Client) Release(ctx context.Context, h Held) (*Task, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	if s, ok := c.remote.claims.lookup(h); ok {
		c.remote.claims.forget(s.run) // the run changes: its remembered state is stale
	}
	t, err := c.settle(ctx, h, "hand back", func(*Worker, *claim) (outcome, error) {
		return outcome{kind: Pending}, nil
	})
	if err == nil && t.CurrentStatus != Pending {
		// A task with a record of its own keeps its record: the copy
		// shows what the hand back wrote.
		t.CurrentStatus, t.Attempt, t.Token = Pending, t.Attempt-1, 0
	}
	return t, err
}

// reportOne is Report of one outcome.
func (c *Client) reportOne(ctx context.Context, o Outcome) (*Task, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	r := c.reportCombined(ctx, []Outcome{o})[0]
	return r.Task, r.Err
}

// settle writes the outcome decide gives for claim h, reading the claim
// again when a concurrent outcome of the same run got in first.
func (c *Client) settle(ctx context.Context, h Held, verb string, decide func(*Worker, *claim) (outcome, error)) (*Task, error) {
	for try := 0; try < 20; try++ {
		w, cl, st, err := c.held(ctx, h)
		if err != nil {
			return nil, err
		}
		o, err := decide(w, cl)
		if err != nil {
			return nil, err
		}
		o.c = cl
		if cl.run != nil && o.kind != Succeeded {
			// The task leaves its segment for a record of its own: in
			// a FIFO queue, in shard 0.
			cfg, err := c.GetConfig(ctx, h.Queue)
			if err != nil {
				return nil, err
			}
			w.sched.fifo.Store(cfg.FIFO)
		}
		ok, err := w.writeOutcome(ctx, o, st)
		if err != nil {
			return nil, fmt.Errorf("queue: %s task %s: %w", verb, h.ID, err)
		}
		if ok {
			return cl.task, nil
		}
		sleepCtx(ctx, time.Duration(rand.Int64N(int64(5*time.Millisecond))))
	}
	return nil, fmt.Errorf("queue: %s task %s: the other outcomes of its claim kept changing; try again", verb, h.ID)
}

// fenced is the error of an outcome or heartbeat for a claim that no
// longer holds.
func fenced(h Held, why string) error {
	return fmt.Errorf("queue: task %s token %d: %w: %s", h.ID, h.Token, lease.ErrFenced, why)
}
