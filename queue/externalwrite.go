package queue

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runWrites decides the outcomes of group g as last read: each outcome
// whose claim holds joins the write of its run; the others get their error
// in out.
func (c *Client) runWrites(ctx context.Context, g *segGroup, os []Outcome, out []Reported) []*runWrite {
	byTok := map[int64]*runWrite{}
	var writes []*runWrite
	for _, i := range g.items {
		h, slot := os[i].Held, g.slots[i]
		r, at, err := g.holds(h, slot)
		if err == nil {
			var t *Task
			if t, err = c.groupTask(ctx, g, slot, h.ID); err == nil {
				rw := byTok[h.Token]
				if rw == nil {
					rw = c.newRunWrite(g, r)
					byTok[h.Token] = rw
					writes = append(writes, rw)
				}
				t.Attempt, t.Token, t.CurrentStatus = r.v.Attempts[at], r.token, Running
				o := decideOutcome(rw.w, t, os[i])
				o.c = &claim{task: t, claimKey: r.key, token: r.token, claimedAt: r.v.ClaimedAt, run: rw.run, slot: slot}
				rw.os, rw.items = append(rw.os, o), append(rw.items, i)
			}
		}
		if err != nil {
			out[i].Err = err
		}
	}
	ending := 0
	for _, rw := range writes {
		rw.final = true
		for _, s := range rw.slots {
			reported := slices.ContainsFunc(rw.os, func(o outcome) bool { return o.c.slot == s })
			rw.final = rw.final && (reported || g.done[rw.run.token][s] || g.exits[s])
		}
		if rw.final {
			ending++
		}
	}
	for _, rw := range writes {
		rw.others = len(g.runs) > ending // runs of the segment that go on
		if g.cached != nil {
			// Not read: others may have runs in the segment unless this
			// one took its last free slots.
			rw.others = !g.cached.last
		}
	}
	return writes
}

// holds checks that claim h of slot holds as g was read: it returns the
// run that holds it, and the slot's place in the run; an error matching
// lease.ErrFenced otherwise.
func (g *segGroup) holds(h Held, slot int) (leasedRun, int, error) {
	var other bool
	for _, r := range g.runs {
		at := slices.Index(r.v.Slots, slot)
		switch {
		case at < 0:
			continue
		case r.token != h.Token:
			other = true
			continue
		case h.Lease != 0 && r.lease != int64(h.Lease):
			return r, at, fenced(h, "the claim is bound to another session")
		case g.done[h.Token][slot] || g.exits[slot]:
			return r, at, fenced(h, "the task's attempt has ended (its outcome was written, or it was cancelled)")
		}
		return r, at, nil
	}
	if other {
		return leasedRun{}, 0, fenced(h, "the task was claimed again since (its claim has another token)")
	}
	return leasedRun{}, 0, fenced(h, "the task is not claimed under this token (its claim ended: the session expired, the task was cancelled, or its outcome was written)")
}

// groupTask is the task of slot in g's segment, as a claim of it starts:
// from the client's cache of segments (read and decoded only when not
// there).
func (c *Client) groupTask(ctx context.Context, g *segGroup, slot int, id string) (*Task, error) {
	if t, ok := g.byslot[slot]; ok && t.ID == id {
		t.Transitions = []Transition{{Status: Pending, At: t.Metadata.CreatedAt}}
		return &t, nil
	}
	if g.tasks == nil {
		ts, err := c.segmentTasks(ctx, g.q, g.seg)
		if err != nil {
			return nil, err
		}
		g.tasks = ts
	}
	t, ok := taskOf(g.tasks, slot)
	if !ok || t.ID != id {
		return nil, fmt.Errorf("%w: %s (its segment is gone)", ErrNotFound, id)
	}
	t.Queue = g.q
	t.Transitions = []Transition{{Status: Pending, At: t.Metadata.CreatedAt}}
	return t, nil
}

// newRunWrite is the write of outcomes of run r of g.
func (c *Client) newRunWrite(g *segGroup, r leasedRun) *runWrite {
	run := &segRun{seg: g.seg, runKey: r.key, tryKey: c.keys.Tries(g.q, g.seg) + r.rest, token: r.token, claimedAt: r.v.ClaimedAt, v: r.v}
	// The run's outcome keys are told apart by a sequence number, which a
	// Worker counts in memory; here, the clock's (the write lets no two
	// outcomes of a run in at once).
	run.outSeq.Store(time.Now().UnixNano())
	w := c.outcomeWorker(g.q, r.v.Worker)
	w.sched.fifo.Store(g.fifo) // a FIFO queue's tasks leave their segments for shard 0
	return &runWrite{g: g, run: run, w: w, slots: r.v.Slots}
}

// ownOuts is the compare that no outcome of rw's run was written after
// revision rev: another would have made this one the run's last, or be its
// twin.
func (rw *runWrite) ownOuts(c *Client, rev int64) clientv3.Cmp {
	return clientv3.Compare(clientv3.ModRevision(runOuts(c.keys, rw.g.q, rw.g.seg, rw.run.token)).WithPrefix(), "<", rev+1)
}

// writeRuns writes writes: the outcomes of each run in one nested
// transaction, as many in one request as etcd takes (as Worker.commit
// packs them). It answers in out, and returns the groups to read again:
// the outcomes of runs whose write was refused.
func (c *Client) writeRuns(ctx context.Context, writes []*runWrite, out []Reported) []*segGroup {
	now := time.Now().UTC()
	markers := map[string]bool{}
	var reqs []ackReq
	var owners []*runWrite
	var again []*segGroup
	for _, rw := range writes {
		rs, later := rw.w.runReqs(rw.run, rw.os, rw.final, true, now, markers)
		if rw.g.cached != nil {
			if len(rs) != 1 || later {
				// Large results: written from a read, as below.
				c.remote.claims.forget(rw.g.cached)
				again = retryLater(again, rw, 0)
				continue
			}
			rs[0].cmps = append(rs[0].cmps, rw.g.exitsSince(c))
		}
		if len(rs) != 1 || later {
			// Large results: the run's parts one after the other.
			again = c.writeChained(ctx, rw, rs, later, out, again)
			continue
		}
		rs[0].cmps = append(rs[0].cmps, rw.ownOuts(c, rw.g.rev))
		reqs, owners = append(reqs, rs[0]), append(owners, rw)
	}
	extra := markerOps(markers)
	from, size, width := 0, 0, 0
	for k, r := range reqs {
		if k > from && (size+r.size > maxRequestBytes || k-from+1+len(extra)+max(width, r.width()) > 127) {
			again = c.writeReqs(ctx, reqs[from:k], owners[from:k], extra, out, again)
			from, size, width = k, 0, 0
		}
		size, width = size+r.size, max(width, r.width())
	}
	if from < len(reqs) {
		again = c.writeReqs(ctx, reqs[from:], owners[from:], extra, out, again)
	}
	return again
}

// writeReqs writes reqs, the outcomes of owners, in one request.
func (c *Client) writeReqs(ctx context.Context, reqs []ackReq, owners []*runWrite, extra []clientv3.Op, out []Reported, again []*segGroup) []*segGroup {
	ops := make([]clientv3.Op, 0, len(reqs)+len(extra))
	for _, r := range reqs {
		ops = append(ops, r.op())
	}
	began := time.Now()
	resp, err := c.cli.Txn(ctx).Then(append(ops, extra...)...).Commit()
	metrics.ObserveTxn("ack", began)
	var closing [][2]string // segments the outcomes may have finished
	for k, rw := range owners {
		switch {
		case err != nil:
			c.remote.claims.forget(rw.g.cached)
			for _, i := range rw.items {
				out[i].Err = fmt.Errorf("queue: record the outcome of task %s: %w", rw.os[0].c.task.ID, err)
			}
		case resp.Responses[k].GetResponseTxn().Succeeded:
			if rw.g.cached != nil {
				c.remote.claims.wrote(rw.g.cached, rw.writtenSlots(), resp.Header.Revision, rw.final)
			}
			c.answer(rw, len(rw.os), out)
			if rw.final && !rw.others {
				closing = append(closing, [2]string{rw.g.q, rw.g.seg})
			}
		default:
			if rw.g.cached != nil {
				c.remote.claims.stale.Add(1)
				c.remote.claims.forget(rw.g.cached)
			}
			again = retryLater(again, rw, 0)
		}
	}
	c.closeDone(ctx, closing)
	return again
}

// writeChained writes reqs, the parts of rw's outcomes, one after the
// other, each fenced by the run and by no other outcome of it since the
// last part; later: then the run goes.
func (c *Client) writeChained(ctx context.Context, rw *runWrite, reqs []ackReq, later bool, out []Reported, again []*segGroup) []*segGroup {
	rev, n := rw.g.rev, 0
	if later {
		reqs = append(reqs, rw.w.runDelete(rw.run))
	}
	for _, r := range reqs {
		r.cmps = append(r.cmps, rw.ownOuts(c, rev))
		resp, err := c.cli.Txn(ctx).If(r.cmps...).Then(r.then...).Commit()
		if err != nil {
			// The parts before this one were written: answer them (and
			// keep the run, which still has outcomes to come).
			rw.final = false
			c.written(ctx, rw, n, out)
			for _, i := range rw.items[n:] {
				out[i].Err = fmt.Errorf("queue: record the outcome of task %s: %w", rw.os[n].c.task.ID, err)
			}
			return again
		}
		if !resp.Succeeded {
			rw.final = false // (the parts written count; the rest is read again)
			c.written(ctx, rw, n, out)
			return retryLater(again, rw, n)
		}
		rev, n = resp.Header.Revision, n+len(r.kept)
	}
	c.written(ctx, rw, n, out)
	return again
}

// written answers the first n outcomes of rw, which were written, and
// closes the segment when the run that ended was its only one (as read) and
// every slot has finished.
func (c *Client) written(ctx context.Context, rw *runWrite, n int, out []Reported) {
	c.answer(rw, n, out)
	if rw.final && !rw.others {
		c.closeDone(ctx, [][2]string{{rw.g.q, rw.g.seg}})
	}
}

// answer answers the first n outcomes of rw, which were written.
func (c *Client) answer(rw *runWrite, n int, out []Reported) {
	for k, o := range rw.os[:n] {
		rw.w.count(o)
		switch o.kind {
		case Succeeded:
			succeeded(o.c.task, o.result)
		case Retrying:
			c.retryAt(rw.g.q, o.c.task.ScheduledAt)
		}
		out[rw.items[k]] = Reported{Task: o.c.task}
	}
}

// writtenSlots are the slots of rw's outcomes.
func (rw *runWrite) writtenSlots() []int {
	out := make([]int, len(rw.os))
	for k, o := range rw.os {
		out[k] = o.c.slot
	}
	return out
}

// retryLater adds rw's outcomes from the nth on to the groups to read
// again.
func retryLater(again []*segGroup, rw *runWrite, n int) []*segGroup {
	var g *segGroup
	for _, a := range again {
		if a.q == rw.g.q && a.seg == rw.g.seg {
			g = a
		}
	}
	if g == nil {
		g = &segGroup{q: rw.g.q, seg: rw.g.seg, slots: rw.g.slots, tok: rw.g.tok, tasks: rw.g.tasks}
		again = append(again, g)
	}
	g.items = append(g.items, rw.items[n:]...)
	return again
}
