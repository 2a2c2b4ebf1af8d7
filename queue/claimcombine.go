package queue

import (
	"context"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Claims of one queue that external workers (the HTTP API's sessions, each
// with its own request) make at the same time are combined, as their
// outcomes are (reportcombine.go). A claim that arrives while none of its
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
func (c *Client) claimTurn(ctx context.Context, w *claimer, q string, n int) (claims []*claim, rev int64, contended bool, err error) {
	cc := &c.remote.claimers
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
			c.claimTogether(ctx, q, batch)
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
func (c *Client) claimTogether(ctx context.Context, q string, batch []*claimCall) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), claimCombineTimeout)
	all := batch
	defer func() {
		cancel()
		for _, call := range all[1:] {
			close(call.done)
		}
	}()
	lead := batch[0].w
	levels, fifo, _, open, _, err := lead.readLevels(rctx, batch[0].n, "", true)
	if err != nil || len(levels) > 0 || fifo {
		// Tasks with records of their own go first, and a FIFO queue's
		// claims all take its oldest segment: each claims alone.
		return
	}
	lead.pickN = len(batch)
	names, err := lead.pickSegments(rctx, open, false, lead.turnSeq.Load()+1)
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
		if rc := c.planRun(rctx, call, states[i], tss[i]); rc != nil {
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
	c.remote.claimers.rounds.Add(1)
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
		c.remote.claimers.served.Add(1)
		if free := len(rc.free); free > len(rc.pick) {
			call.w.setPredicted(0, rc.st.after(call.claims[0].run, c.keys.Runs(q, rc.st.name), rc.pick))
		} else {
			call.w.setHot(0, "")
		}
	}
}

// readStates reads the states of segments names of queue q, and their
// tasks (from the Client's cache where it has them), in one request.
func (c *Client) readStates(ctx context.Context, q string, names []string) ([]*segState, [][]Task, error) {
	var ops []clientv3.Op
	cached := make([]bool, len(names))
	tss := make([][]Task, len(names))
	for i, seg := range names {
		ops = append(ops, c.stateOps(q, seg)...)
		if tss[i], cached[i] = c.segCache.get(q + "/" + seg); !cached[i] {
			ops = append(ops, clientv3.OpGet(c.keys.Segment(q, seg)))
		}
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, nil, err
	}
	states := make([]*segState, len(names))
	rs := resp.Responses
	for i, seg := range names {
		n := len(c.stateOps(q, seg))
		states[i] = c.parseState(q, seg, resp.Header.Revision, rs[:n])
		rs = rs[n:]
		if cached[i] {
			continue
		}
		if kvs := rs[0].GetResponseRange().Kvs; len(kvs) > 0 {
			if tss[i], err = c.cacheSegment(q, seg, kvs[0].Value); err != nil {
				tss[i] = nil
			}
		}
		rs = rs[1:]
	}
	return states, tss, nil
}

// planRun is the run that claims call's tasks from segment st (whose
// tasks are ts), nil when it has none free for it. A finished segment
// found open is closed.
func (c *Client) planRun(ctx context.Context, call *claimCall, st *segState, ts []Task) *runClaim {
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
