package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// An outcome of a task in a segment is fenced and recorded from the keys
// of its run alone: the run whose key's create revision is the token says
// that the claim holds (and under which lease), which attempt runs and
// which slots the run holds; the run's own outcome keys and the segment's
// exits say which of them have finished. The segment's tasks are not read
// to write an outcome (only to answer with the task: from the client's
// cache, which the claim filled).

// segGroup is the outcomes of a Report for the tasks of one segment, and
// what the last read saw of the segment's runs.
type segGroup struct {
	q, seg string
	items  []int         // the outcomes (indexes into Report's)
	slots  map[int]int   // each outcome's slot
	tok    map[int]int64 // each outcome's token
	// The read:
	rev   int64
	runs  []leasedRun
	done  map[int64]map[int]bool // per run (token), its slots with an outcome
	exits map[int]bool
	fifo  bool
	tasks []Task // the segment's tasks, once needed
	// cached is the run the group was made of from memory (brokermemory.go),
	// byslot the tasks of its slots as claimed; nil when read.
	cached *cachedRun
	byslot map[int]Task
}

// leasedRun is a run as read, with its lease.
type leasedRun struct {
	runRef
	lease int64
}

// runWrite is the outcomes of one run to write, and the outcome of each.
type runWrite struct {
	g      *segGroup
	run    *segRun
	w      *Worker
	os     []outcome
	items  []int
	slots  []int // the run's slots
	final  bool
	others bool // the segment had runs, as read, that this write does not end
	// at is when the outcomes were written: a success's FinishedAt.
	at time.Time
}

// reportSegments records the outcomes of groups, reading them again when
// another outcome of one of their runs got in first.
func (b *broker) reportSegments(ctx context.Context, os []Outcome, groups []*segGroup, out []Reported) {
	for try := 0; len(groups) > 0; try++ {
		if try == 20 {
			for _, g := range groups {
				for _, i := range g.items {
					out[i].Err = fmt.Errorf("queue: report task %s: the other outcomes of its claim kept changing; try again", os[i].ID)
				}
			}
			return
		}
		if try > 0 {
			sleepCtx(ctx, time.Duration(rand.Int64N(int64(5*time.Millisecond))))
		}
		if err := b.readRuns(ctx, groups); err != nil {
			for _, g := range groups {
				for _, i := range g.items {
					out[i].Err = err
				}
			}
			return
		}
		var writes []*runWrite
		for _, g := range groups {
			writes = append(writes, b.runWrites(ctx, g, os, out)...)
		}
		groups = b.writeRuns(ctx, writes, out)
	}
}

// readRuns reads, for each group, its segment's runs and exits, the
// outcome keys of the runs its outcomes name, and its queue's config.
func (b *broker) readRuns(ctx context.Context, groups []*segGroup) error {
	c := b.client
	var ops []clientv3.Op
	var part []*segGroup
	flush := func() error {
		if len(part) == 0 {
			return nil
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("queue: read the runs of segment %s of %s: %w", part[0].seg, part[0].q, err)
		}
		rs := resp.Responses
		for _, g := range part {
			n := 3 + len(g.tokens())
			g.parseRuns(c, resp.Header.Revision, rs[:n])
			rs = rs[n:]
		}
		ops, part = ops[:0], part[:0]
		return nil
	}
	for _, g := range groups {
		more := []clientv3.Op{
			clientv3.OpGet(c.keys.Runs(g.q, g.seg), clientv3.WithPrefix()),
			clientv3.OpGet(c.keys.Exits(g.q, g.seg), clientv3.WithPrefix(), clientv3.WithKeysOnly()),
			clientv3.OpGet(c.keys.QueueConfig(g.q)),
		}
		for _, tok := range g.tokens() {
			more = append(more, clientv3.OpGet(runOuts(c.keys, g.q, g.seg, tok), clientv3.WithPrefix()))
		}
		if len(ops)+len(more) > 120 {
			if err := flush(); err != nil {
				return err
			}
		}
		ops, part = append(ops, more...), append(part, g)
	}
	return flush()
}

// runOuts is the prefix of the outcome keys of the run with token tok.
func runOuts(keys keyspace.Space, q, seg string, tok int64) string {
	return keys.RunOuts(q, seg, tok)
}

// tokens are the tokens g's outcomes name, in order, once each.
func (g *segGroup) tokens() []int64 {
	var out []int64
	for _, i := range g.items {
		if tok := g.token(i); !slices.Contains(out, tok) {
			out = append(out, tok)
		}
	}
	return out
}

// token is outcome i's token.
func (g *segGroup) token(i int) int64 { return g.tok[i] }

// parseRuns reads the responses of readRuns for g.
func (g *segGroup) parseRuns(c *Client, rev int64, rs []*pb.ResponseOp) {
	g.rev, g.runs, g.exits, g.done = rev, nil, map[int]bool{}, map[int64]map[int]bool{}
	pre := c.keys.Runs(g.q, g.seg)
	for _, kv := range rs[0].GetResponseRange().Kvs {
		v, err := taskstore.DecodeRun(kv.Value)
		if err != nil || len(v.Attempts) != len(v.Slots) {
			continue
		}
		g.runs = append(g.runs, leasedRun{runRef{key: string(kv.Key), rest: keyspace.RunNameOf(pre, string(kv.Key)), token: kv.CreateRevision, v: v}, kv.Lease})
	}
	for _, kv := range rs[1].GetResponseRange().Kvs {
		if s, _, ok := c.keys.ParseExitKey(g.q, g.seg, string(kv.Key)); ok {
			g.exits[s] = true
		}
	}
	var cfg Config
	if kvs := rs[2].GetResponseRange().Kvs; len(kvs) == 1 {
		_ = json.Unmarshal(kvs[0].Value, &cfg)
	}
	g.fifo = cfg.FIFO
	for j, tok := range g.tokens() {
		done := map[int]bool{}
		for _, kv := range rs[3+j].GetResponseRange().Kvs {
			o, err := taskstore.DecodeOut(kv.Value)
			if err != nil {
				continue
			}
			for _, s := range o.OK {
				done[s.Slot] = true
			}
			for _, s := range o.Moved {
				done[s] = true
			}
		}
		g.done[tok] = done
	}
}

// runWrites decides the outcomes of group g as last read: each outcome
// whose claim holds joins the write of its run; the others get their error
// in out.
func (b *broker) runWrites(ctx context.Context, g *segGroup, os []Outcome, out []Reported) []*runWrite {
	byTok := map[int64]*runWrite{}
	var writes []*runWrite
	for _, i := range g.items {
		h, slot := os[i].Held, g.slots[i]
		r, at, err := g.holds(h, slot)
		if err == nil {
			var t *Task
			if t, err = b.groupTask(ctx, g, slot, h.ID); err == nil {
				rw := byTok[h.Token]
				if rw == nil {
					rw = b.newRunWrite(g, r)
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
func (b *broker) groupTask(ctx context.Context, g *segGroup, slot int, id string) (*Task, error) {
	c := b.client
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
func (b *broker) newRunWrite(g *segGroup, r leasedRun) *runWrite {
	c := b.client
	run := &segRun{seg: g.seg, runKey: r.key, tryKey: c.keys.Try(g.q, g.seg, r.rest), token: r.token, claimedAt: r.v.ClaimedAt, v: r.v}
	// The run's outcome keys are told apart by a sequence number, which a
	// Worker counts in memory; here, the clock's (the write lets no two
	// outcomes of a run in at once).
	run.outSeq.Store(time.Now().UnixNano())
	w := b.outcomeWorker(g.q, r.v.Worker)
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
func (b *broker) writeRuns(ctx context.Context, writes []*runWrite, out []Reported) []*segGroup {
	c := b.client
	now := time.Now().UTC()
	var reqs []ackReq
	var owners []*runWrite
	var again []*segGroup
	for _, rw := range writes {
		rw.at = now
		markers := map[string]bool{}
		rs, later := rw.w.runReqs(rw.run, rw.os, rw.final, true, now, markers)
		if rw.g.cached != nil {
			if len(rs) != 1 || later {
				// Large results: written from a read, as below.
				b.claims.forget(rw.g.cached)
				again = retryLater(again, rw, 0)
				continue
			}
			rs[0].cmps = append(rs[0].cmps, rw.g.exitsSince(c))
		}
		if len(rs) != 1 || later {
			// Large results: the run's parts one after the other.
			again = b.writeChained(ctx, rw, rs, later, out, again)
			continue
		}
		rs[0].cmps = append(rs[0].cmps, rw.ownOuts(c, rw.g.rev))
		reqs, owners = append(reqs, rs[0]), append(owners, rw)
	}
	packReqs(reqs, func(from, to int) { again = b.writeReqs(ctx, reqs[from:to], owners[from:to], out, again) })
	return again
}

// writeReqs writes reqs, the outcomes of owners, in one request.
func (b *broker) writeReqs(ctx context.Context, reqs []ackReq, owners []*runWrite, out []Reported, again []*segGroup) []*segGroup {
	c := b.client
	extra := marksOf(reqs)
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
			b.claims.forget(rw.g.cached)
			for _, i := range rw.items {
				out[i].Err = fmt.Errorf("queue: record the outcome of task %s: %w", rw.os[0].c.task.ID, err)
			}
		case resp.Responses[k].GetResponseTxn().Succeeded:
			if rw.g.cached != nil {
				b.claims.wrote(rw.g.cached, rw.writtenSlots(), resp.Header.Revision, rw.final)
			}
			b.answer(rw, len(rw.os), out)
			if rw.final && !rw.others {
				closing = append(closing, [2]string{rw.g.q, rw.g.seg})
			}
		default:
			if rw.g.cached != nil {
				b.claims.stale.Add(1)
				b.claims.forget(rw.g.cached)
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
func (b *broker) writeChained(ctx context.Context, rw *runWrite, reqs []ackReq, later bool, out []Reported, again []*segGroup) []*segGroup {
	c := b.client
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
			b.written(ctx, rw, n, out)
			for _, i := range rw.items[n:] {
				out[i].Err = fmt.Errorf("queue: record the outcome of task %s: %w", rw.os[n].c.task.ID, err)
			}
			return again
		}
		if !resp.Succeeded {
			rw.final = false // (the parts written count; the rest is read again)
			b.written(ctx, rw, n, out)
			return retryLater(again, rw, n)
		}
		rev, n = resp.Header.Revision, n+len(r.kept)
		if err := putMarks(ctx, c.cli, marksOf([]ackReq{r})); err != nil {
			rw.w.logger.Error("queue: could not mark the parents of children that ended; they wait until another child ends", "err", err)
		}
	}
	b.written(ctx, rw, n, out)
	return again
}

// written answers the first n outcomes of rw, which were written, and
// closes the segment when the run that ended was its only one (as read) and
// every slot has finished.
func (b *broker) written(ctx context.Context, rw *runWrite, n int, out []Reported) {
	c := b.client
	b.answer(rw, n, out)
	if rw.final && !rw.others {
		c.closeDone(ctx, [][2]string{{rw.g.q, rw.g.seg}})
	}
}

// answer answers the first n outcomes of rw, which were written.
func (b *broker) answer(rw *runWrite, n int, out []Reported) {
	for k, o := range rw.os[:n] {
		rw.w.count(o)
		switch o.kind {
		case Succeeded:
			// The task stays in its segment: its history is what a read
			// of it shows (segState.fill), not only the PENDING it was
			// claimed with. Tasks that left it got theirs in recordOps.
			t := o.c.task
			t.Transitions = appendLost(t.Transitions, t.Attempt, o.c.claimedAt)
			t.Transitions = append(t.Transitions,
				Transition{Status: Running, At: o.c.claimedAt, Attempt: t.Attempt, Worker: rw.w.worker},
				Transition{Status: Succeeded, At: rw.at, Attempt: t.Attempt, Worker: rw.w.worker})
			succeeded(t, o.result)
		case Retrying, Sleeping:
			b.retryAt(rw.g.q, o.c.task.ScheduledAt)
		case Pending:
			if o.deferred != "" {
				b.retryAt(rw.g.q, o.c.task.ScheduledAt)
			}
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
