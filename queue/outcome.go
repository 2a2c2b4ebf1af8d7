package queue

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"time"

	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// writer is the outcome writer of o: a run's outcomes all go to one, in
// order.
func (o outcome) writer() int {
	if o.c.run != nil {
		return o.c.run.writer
	}
	return shardOf(o.c.task.ID) % claimers
}

// acker writes outcomes in batches. It ends when outcomes is closed and
// everything in it is written.
func (w *Worker) acker(outcomes <-chan outcome) {
	batch := make([]outcome, 0, 100)
	for o := range outcomes {
		batch = append(batch[:0], o)
	more:
		for len(batch) < 100 {
			select {
			case o, ok := <-outcomes:
				if !ok {
					break more
				}
				batch = append(batch, o)
			default:
				break more
			}
		}
		w.commit(batch)
	}
}

// ackReq is one nested transaction of an outcome request and the outcomes
// it records.
type ackReq struct {
	cmps []clientv3.Cmp
	then []clientv3.Op
	kept []outcome
	size int
	// run is the run whose outcomes these are (nil for a task with a
	// record of its own); final: the request deletes it.
	run   *segRun
	final bool
	// exact: the run's outcomes are fenced by a compare per slot of their
	// exits, not by one over the segment's (runReqs).
	exact bool
	// marks are the keys the request holding these outcomes puts once at
	// its top level (packReqs, brokerreport.go).
	marks []string
}

func (r ackReq) op() clientv3.Op { return clientv3.OpTxn(r.cmps, r.then, nil) }

// width is the most operations along one nesting path of the nested
// transaction, its own level and the levels nested in it (a wait's
// conditional park, waitOps): etcd allows 128 along each path, counting
// the request's own operations too.
func (r ackReq) width() int { return txnWidth(r.cmps, r.then, nil) }

// txnWidth is the most operations along one nesting path of the
// transaction If(cmps) Then(then) Else(els): the most at its own level
// (compares, then or else) plus the widest nested transaction.
func txnWidth(cmps []clientv3.Cmp, then, els []clientv3.Op) int {
	return max(len(cmps), len(then), len(els)) + max(nestedWidth(then), nestedWidth(els))
}

// nestedWidth is the widest transaction nested among ops (0: none).
func nestedWidth(ops []clientv3.Op) int {
	n := 0
	for _, op := range ops {
		if op.IsTxn() {
			n = max(n, txnWidth(op.Txn()))
		}
	}
	return n
}

// tooManyOps reports whether err is etcd's refusal of a request with too
// many operations along a nesting path: the same request always fails so.
func tooManyOps(err error) bool {
	return errors.Is(err, rpctypes.ErrTooManyOps) || rpctypes.ErrorDesc(err) == rpctypes.ErrorDesc(rpctypes.ErrGRPCTooManyOps)
}

// commit writes a batch of outcomes: a task with a record of its own in a
// nested transaction fenced by its claim; the tasks of one run together, in
// one nested transaction fenced by the run. The batch with a run's last
// outcome deletes the run: in the same nested transaction when it takes
// one, else after the others were written, and never when an outcome of
// the run could not be written (the run then stays until the lease ends,
// so its tasks keep their attempts).
func (w *Worker) commit(batch []outcome) {
	now := time.Now().UTC()
	var reqs []ackReq
	var runs []*segRun
	byRun := map[*segRun][]outcome{}
	for _, o := range batch {
		if o.c.run == nil {
			if o.kind == Cancelled {
				continue // the canceller or the lease took the claim away
			}
			markers := map[string]bool{}
			cmps, then, n := w.ackOp(o, now, markers)
			reqs = append(reqs, ackReq{cmps: cmps, then: then, kept: []outcome{o}, size: n})
			setMarks(reqs[len(reqs)-1:], markers)
			continue
		}
		if _, ok := byRun[o.c.run]; !ok {
			runs = append(runs, o.c.run)
		}
		byRun[o.c.run] = append(byRun[o.c.run], o)
	}
	var deleteAfter []*segRun
	for _, r := range runs {
		final := r.remaining.Add(-int32(len(byRun[r]))) == 0
		markers := map[string]bool{}
		more, later := w.runReqs(r, byRun[r], final, false, now, markers)
		reqs = append(reqs, more...)
		if later {
			deleteAfter = append(deleteAfter, r)
		}
	}
	packReqs(reqs, func(from, to int) { w.write(reqs[from:to]) })
	for _, r := range deleteAfter {
		if !r.lost.Load() {
			w.write([]ackReq{w.runDelete(r)})
		}
	}
}

// write records outcomes in one request, retrying a few times; a request
// that keeps failing is split in two, and an outcome that cannot be written
// at all is handed back, so its task does not stay claimed under a live
// lease. Their marks are put once per request (packReqs, brokerreport.go).
func (w *Worker) write(reqs []ackReq) {
	if len(reqs) == 0 {
		return
	}
	extra := marksOf(reqs)
	ops := make([]clientv3.Op, 0, len(reqs)+len(extra))
	for _, r := range reqs {
		ops = append(ops, r.op())
	}
	ops = append(ops, extra...)
	var resp *clientv3.TxnResponse
	var err error
	for try := 0; try < 3; try++ {
		ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
		began := time.Now()
		resp, err = w.cli.Txn(ctx).Then(ops...).Commit()
		metrics.ObserveTxn("ack", began)
		cancel()
		if err == nil || w.lease.Err() != nil || tooManyOps(err) {
			break // a request with too many operations is split at once
		}
		_ = lifecycle.Sleep(w.lease.Context(), time.Duration(try+1)*200*time.Millisecond) // ends early when the lease is lost
	}
	if err != nil {
		w.writeFailed(reqs, extra, err)
		return
	}
	var ended []*segRun
	var finished []outcome
	var cascades []*Task
	defer func() {
		w.runsEnded(ended)
		if len(cascades) > 0 {
			w.finishing.Go(func() { w.cascadeDead(cascades) })
		}
		if len(finished) > 0 {
			w.finishing.Go(func() { w.finishStreams(finished) }) // after the outcomes, off the acker's path
		}
	}()
	for i, r := range reqs {
		if !resp.Responses[i].GetResponseTxn().Succeeded {
			if r.run != nil {
				w.runRefused(r)
				continue
			}
			w.fenced.Add(1)
			w.logger.Warn("queue: outcome refused: the claim was lost", "task", r.kept[0].c.task.ID, "attempt", r.kept[0].c.task.Attempt)
			continue
		}
		for _, o := range r.kept {
			w.count(o)
			if failFast(o) {
				cascades = append(cascades, o.c.task)
			}
			if o.streamed && len(o.done) == 0 && (o.kind == Succeeded || o.kind == Dead) {
				finished = append(finished, o)
			}
		}
		if r.final && r.run.last {
			ended = append(ended, r.run)
		}
	}
}

// writeFailed handles a request that could not be written: split in two,
// or, for one task, handed back.
func (w *Worker) writeFailed(reqs []ackReq, extra []clientv3.Op, err error) {
	if w.lease.Err() != nil {
		return // the claims went with the lease; others take the tasks
	}
	if len(reqs) > 1 {
		h := len(reqs) / 2
		w.write(reqs[:h])
		w.write(reqs[h:])
		return
	}
	if reqs[0].run != nil {
		// A run's outcomes that cannot be written: the run stays until
		// the lease ends (nothing deletes it now), and then its tasks
		// run again, their attempts counted.
		reqs[0].run.lost.Store(true)
		w.logger.Error("queue: could not record the outcomes of a run; its tasks run again when this worker's lease ends", "segment", reqs[0].run.seg, "tasks", len(reqs[0].kept), "err", err)
		return
	}
	o := reqs[0].kept[0]
	if o.kind == Pending {
		// Handing back failed too: keep trying while the lease lives,
		// or the task stays claimed (RUNNING) until this worker ends.
		for try := 0; try < 30 && w.lease.Err() == nil; try++ {
			_ = lifecycle.Sleep(w.lease.Context(), time.Second) // ends early when the lease is lost
			ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
			_, err = w.cli.Txn(ctx).Then(append([]clientv3.Op{reqs[0].op()}, extra...)...).Commit()
			cancel()
			if err == nil {
				w.handedBack.Add(1)
				return
			}
		}
		w.logger.Error("queue: could not hand a task back; it is claimable again when this worker's lease ends", "task", o.c.task.ID, "err", err)
		return
	}
	w.logger.Warn("queue: could not record a task's outcome; handing it back", "task", o.c.task.ID, "err", err)
	back := o
	back.kind = Pending
	back.deferred = ""
	markers := map[string]bool{}
	cmps, then, _ := w.ackOp(back, time.Now().UTC(), markers)
	backReq := []ackReq{{cmps: cmps, then: then, kept: []outcome{back}}}
	setMarks(backReq, markers)
	w.write(backReq)
}

func markerOps(markers map[string]bool) []clientv3.Op {
	var out []clientv3.Op
	for k := range markers {
		out = append(out, clientv3.OpPut(k, ""))
	}
	return out
}

// count adds a written outcome to the worker's counts and metrics.
func (w *Worker) count(o outcome) {
	t := o.c.task
	switch o.kind {
	case Succeeded:
		w.succeeded.Add(1)
		metrics.TasksSucceeded.WithLabelValues(t.Queue, t.Type).Inc()
	case Retrying:
		w.retried.Add(1)
		metrics.TasksFailed.WithLabelValues(t.Queue, t.Type).Inc()
		metrics.TasksRetried.WithLabelValues(t.Queue, t.Type).Inc()
	case Dead:
		w.dead.Add(1)
		metrics.TasksFailed.WithLabelValues(t.Queue, t.Type).Inc()
		metrics.TasksDead.WithLabelValues(t.Queue, t.Type).Inc()
	case Pending:
		w.handedBack.Add(1)
		if o.deferred != "" { // labelled by its kind ("budget KEY"), not the counts that may follow
			label, _, _ := strings.Cut(o.deferred, ": ")
			if o.deferLabel != "" {
				label = o.deferLabel
			}
			metrics.TasksDeferred.WithLabelValues(t.Queue, t.Type, truncate(label, 128)).Inc()
		}
	}
}

// ackOp is the fenced nested transaction that records one outcome of a task
// with a record of its own: its compares and writes, and its size.
func (w *Worker) ackOp(o outcome, now time.Time, markers map[string]bool) ([]clientv3.Cmp, []clientv3.Op, int) {
	c := o.c
	fence := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.claimKey), "=", c.token)}
	ops, n := w.recordOps(o, now, markers)
	return fence, ops, n
}

// recordOps are the writes that record outcome o in its task's own record
// and indexes. For a task claimed from a segment, they create the record:
// the task leaves its segment (it is retrying, dead or handed back).
// They leave the task as recorded in o.c.task (what a report answers
// with), and start from the task as claimed each time: an outcome built
// again (a run's outcomes refused and sent again exact, runRefused) gives
// its attempt back once and adds its history once.
func (w *Worker) recordOps(o outcome, now time.Time, markers map[string]bool) ([]clientv3.Op, int) {
	o.c.restore()
	c, t := o.c, o.c.task
	seg := c.run != nil
	var ops []clientv3.Op
	if !seg {
		ops = append(ops, clientv3.OpDelete(c.claimKey))
	}
	if seg && w.sched.fifo.Load() {
		zero := 0
		t.Shard = &zero // a FIFO queue's tasks with records are in shard 0
	}
	pendingKey := w.client.pendingKey(t)
	if !seg {
		pendingKey = c.pendingKey
	}
	if o.kind == Waiting { // parked until what it waits for comes, uncharged
		return w.waitOps(o, pendingKey, seg, now, ops, markers)
	}
	// All but a success keep the wait the claim resumed at (WaitingFor,
	// nil: none): the next claim resumes there (see Outcome.Received).
	if o.kind == Sleeping { // parked until its sleep ends, uncharged
		return w.sleepOps(o, pendingKey, seg, now, ops)
	}
	if o.kind == Pending && o.deferred != "" { // deferred by flow control: back after the delay, uncharged
		return w.deferOps(o, pendingKey, seg, now, ops)
	}
	if o.kind == Pending { // handed back: the attempt does not count
		ops = append(ops, clientv3.OpPut(pendingKey, encodePending(t.Attempt-1, false)))
		if seg {
			t.CurrentStatus, t.Attempt, t.Token = Pending, t.Attempt-1, 0
			rec, _ := json.Marshal(t)
			ops = append(ops, clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec)))
			markers[w.client.levelKey(t.Queue, levelOf(t.Metadata.Priority))] = true
			return ops, len(rec) + 500
		}
		return ops, 300
	}
	t.Transitions = appendLost(t.Transitions, t.Attempt, c.claimedAt)
	t.Transitions = appendTransition(t.Transitions, Transition{Status: Running, At: c.claimedAt, Attempt: t.Attempt, Worker: w.worker})
	if !seg {
		ops = append(ops, clientv3.OpDelete(pendingKey))
	}
	var done []clientv3.Op // the outcome for its parent, when t is a child
	switch o.kind {
	case Succeeded:
		t.CurrentStatus, t.Result, t.LastError, t.RetriesAttempted, t.WaitingFor = Succeeded, o.result, "", t.Attempt-1, nil
		done = w.childDone(t, Succeeded, o.result, "", markers)
		ops = append(append(ops, clientv3.OpPut(w.client.doneKey(t.Queue, Succeeded, now, t.ID), "")), done...)
		ops = append(ops, o.spend.consume()...) // the signals it received
	case Retrying:
		t.CurrentStatus, t.RetriesAttempted, t.LastError = Retrying, t.Attempt-1, truncate(o.err.Error(), 4096)
		t.ScheduledAt = now.Add(o.delay)
		rv, _ := json.Marshal(retryValue{PendingKey: pendingKey, Attempts: t.Attempt})
		ops = append(ops, clientv3.OpPut(w.client.retryKey(t), string(rv)))
	case Dead:
		t.CurrentStatus, t.RetriesAttempted, t.LastError = Dead, t.Attempt-1, truncate(o.err.Error(), 4096)
		done = w.childDone(t, Dead, nil, t.LastError, markers)
		ops = append(append(ops, clientv3.OpPut(w.keys.DeadTask(t.Queue, t.ID), ""), w.client.cascadeMarkOp(t)), done...)
	}
	tr := Transition{Status: t.CurrentStatus, At: now, Attempt: t.Attempt, Worker: w.worker}
	if o.err != nil {
		tr.Error = truncate(o.err.Error(), 4096)
	}
	t.Transitions = appendTransition(t.Transitions, tr)
	t.Token, t.StreamSettled = c.token, len(o.done) > 0
	rec, _ := json.Marshal(t)
	ops = append(ops, clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec)))
	ops = append(ops, o.done...) // the stream's Done, with the end (a Retrying task has none)
	return ops, len(rec) + putBytes(done) + putBytes(o.done) + 500
}

// putBytes is the bytes of the keys and values ops put, those of nested
// transactions among them: what they add to a request's size.
func putBytes(ops []clientv3.Op) int {
	n := 0
	for _, op := range ops {
		switch {
		case op.IsTxn():
			_, then, els := op.Txn()
			n += putBytes(then) + putBytes(els)
		case op.IsPut():
			n += len(op.KeyBytes()) + len(op.ValueBytes())
		}
	}
	return n
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// runReqs are the nested transactions that record outcomes os of run r:
// one outcome key per batch for the tasks that succeeded (with their
// results) and the tasks that left the segment, whose records of their own
// are written beside it. Each is fenced by the run (its key's create
// revision) and by the absence of an exit for its slots (a task cancelled
// while it ran): with exact, one compare per slot; without, one compare
// that no exit at all was made in the segment since the run's claim,
// which a cancellation of another task of the segment refuses too, and
// whose refusal is then sent again exact (Worker.runRefused). Exits are
// rare; a compare per task costs the server a key lookup per task.
// final: the run's last outcomes are among os, and the run and its try
// go: in the one nested transaction when os takes one, else later
// (deleteLater) once every part was written, because the parts commit or
// fail apart. Each request carries the marks of its own outcomes, counted
// in its width; markers gets those of them all.
func (w *Worker) runReqs(r *segRun, os []outcome, final, exact bool, now time.Time, markers map[string]bool) (reqs []ackReq, deleteLater bool) {
	q := w.cfg.Queue
	ok, moved := []okSlot(nil), []int(nil)
	var ops []clientv3.Op
	var kept []outcome
	size, inner := 0, 0                                // inner: the widest transaction nested in ops
	part, mine := map[string]bool{}, map[string]bool{} // the marks of kept (each request puts its own), of the outcome added
	flush := func() {
		if len(kept) == 0 {
			return
		}
		defer clear(part)
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.runKey), "=", r.token)}
		var then []clientv3.Op
		if exact || r.exact.Load() {
			for _, o := range kept {
				cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(w.keys.Exit(q, r.seg, o.c.slot)), "=", 0))
			}
		} else {
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(w.keys.Exits(q, r.seg)).WithPrefix(), "<", r.token+1))
		}
		if len(ok)+len(moved) > 0 {
			v := outValue{Worker: w.worker, Token: r.token, ClaimedAt: r.claimedAt, FinishedAt: now, OK: ok, Moved: moved}.Encode()
			then = append(then, clientv3.OpPut(w.keys.Out(q, r.seg, keyspace.OutName(r.token, len(ok), len(moved), r.outSeq.Add(1))), string(v)))
			size += len(v)
		}
		then = append(then, ops...)
		reqs = append(reqs, ackReq{cmps: cmps, then: then, kept: kept, size: size + 500, run: r, exact: exact || r.exact.Load()})
		setMarks(reqs[len(reqs)-1:], part)
		maps.Copy(markers, part)
		ok, moved, ops, kept, size, inner = nil, nil, nil, nil, 0, 0
	}
	for _, o := range os {
		if o.kind == Cancelled {
			continue // the canceller or the lease took the task away
		}
		clear(mine)
		more, n := []clientv3.Op(nil), 0
		if o.kind == Succeeded { // for its parent, when a child; the signals it received
			more = append(append(w.childDone(o.c.task, Succeeded, o.result, "", mine), o.spend.consume()...), o.done...)
			n = len(o.result)*4/3 + putBytes(more)
		} else {
			more, n = w.recordOps(o, now, mine)
		}
		// The request goes first when o would take it past 110 of etcd's 128
		// operations (txnWidth: compares; writes, with an outcome key, the
		// run's deletion and one per signal a success received; the widest
		// nested transaction; marks) or past half a request's bytes.
		cmps := 2
		if exact || r.exact.Load() {
			cmps = 2 + len(kept)
		}
		if len(kept) == SegmentSize || max(cmps, len(ops)+len(more)+3)+max(inner, nestedWidth(more))+len(part)+len(mine) >= 110 || size+n > maxRequestBytes/2 {
			flush()
		}
		if o.kind == Succeeded {
			ok = append(ok, okSlot{Slot: o.c.slot, Attempt: o.c.task.Attempt, Result: o.result})
		} else {
			moved = append(moved, o.c.slot)
		}
		ops, kept = append(ops, more...), append(kept, o)
		size, inner = size+n, max(inner, nestedWidth(more))
		maps.Copy(part, mine)
	}
	flush()
	switch {
	case !final || r.lost.Load():
		return reqs, false
	case len(reqs) == 0:
		return []ackReq{w.runDelete(r)}, false
	case len(reqs) == 1:
		reqs[0].then = append(reqs[0].then, clientv3.OpDelete(r.runKey), clientv3.OpDelete(r.tryKey))
		reqs[0].final = true
		return reqs, false
	}
	return reqs, true
}

// runDelete is the nested transaction that deletes run r and its try,
// fenced by the run.
func (w *Worker) runDelete(r *segRun) ackReq {
	return ackReq{cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(r.runKey), "=", r.token)},
		then: []clientv3.Op{clientv3.OpDelete(r.runKey), clientv3.OpDelete(r.tryKey)}, size: 500, run: r, final: true}
}

// runRefused handles outcomes of a run that etcd refused: when the run is
// gone (the lease ended, or the worker was cut off past its TTL), every one
// is fenced out; when tasks of it were cancelled while they ran, theirs are,
// and the others are written again.
func (w *Worker) runRefused(req ackReq) {
	r, q := req.run, w.cfg.Queue
	if len(req.kept) == 0 {
		return // a delete of the run alone: the run is gone already
	}
	var g *clientv3.TxnResponse
	var err error
	for try := 0; try < 3 && w.lease.Err() == nil; try++ {
		if try > 0 {
			_ = lifecycle.Sleep(w.lease.Context(), time.Duration(try)*200*time.Millisecond) // ends early when the lease is lost
		}
		ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
		g, err = w.cli.Txn(ctx).Then(clientv3.OpGet(r.runKey, clientv3.WithKeysOnly()),
			clientv3.OpGet(w.keys.Exits(q, r.seg), clientv3.WithPrefix(), clientv3.WithKeysOnly())).Commit()
		cancel()
		if err == nil {
			break
		}
	}
	fenced := func(n int, why string) {
		w.fenced.Add(int64(n))
		if n > 0 {
			w.logger.Warn("queue: outcomes refused: "+why, "segment", r.seg, "tasks", n)
		}
	}
	if g == nil || err != nil {
		// Their outcomes unwritten, the run must stay until the lease
		// ends, so that its tasks run again with their attempts counted.
		r.lost.Store(true)
		fenced(len(req.kept), "the run could not be read back")
		return
	}
	run := g.Responses[0].GetResponseRange().Kvs
	if len(run) == 0 || run[0].CreateRevision != r.token {
		fenced(len(req.kept), "the run was lost")
		return
	}
	exited := map[string]bool{}
	for _, kv := range g.Responses[1].GetResponseRange().Kvs {
		exited[string(kv.Key)] = true
	}
	var left []outcome
	for _, o := range req.kept {
		if !exited[w.keys.Exit(q, r.seg, o.c.slot)] {
			left = append(left, o)
		}
	}
	fenced(len(req.kept)-len(left), "the tasks were cancelled while they ran")
	if len(left) == len(req.kept) && req.exact {
		r.lost.Store(true) // as when they could not be written
		w.logger.Error("queue: outcomes refused for no known reason", "segment", r.seg, "tasks", len(left))
		return
	}
	// Sent again with a compare per slot, and so are the run's later
	// batches: an exit of another task of the segment refused the first,
	// and would refuse them all.
	r.exact.Store(true)
	// The marks of the refused request were written with it: only the
	// marks of the outcomes left go again (a txn putting a key twice
	// would be refused).
	markers := map[string]bool{}
	reqs, later := w.runReqs(r, left, req.final, true, time.Now().UTC(), markers)
	w.write(reqs)
	if later && !r.lost.Load() {
		w.write([]ackReq{w.runDelete(r)})
	}
}

// runsEnded closes the segments of runs rs, which took their last free
// slots, once every slot has finished: their states read in one request
// and the finished ones closed in one more (closeDone). Closing them one
// at a time cost the outcome writer two round trips a segment, and small
// segments (delayed tasks falling due a few at a time) end several runs
// in each of its batches.
func (w *Worker) runsEnded(rs []*segRun) {
	if len(rs) == 0 {
		return
	}
	segs := make([][2]string, len(rs))
	for i, r := range rs {
		segs[i] = [2]string{w.cfg.Queue, r.seg}
	}
	ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
	defer cancel()
	w.client.closeDone(ctx, segs)
}
