package queue

import (
	"context"
	"time"

	"github.com/droverhq/drover/keyspace"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
// fail apart.
func (w *Worker) runReqs(r *segRun, os []outcome, final, exact bool, now time.Time, markers map[string]bool) (reqs []ackReq, deleteLater bool) {
	q := w.cfg.Queue
	var ok []okSlot
	var moved []int
	var ops []clientv3.Op
	var kept []outcome
	size := 0
	flush := func() {
		if len(kept) == 0 {
			return
		}
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
			then = append(then, clientv3.OpPut(w.keys.Outs(q, r.seg)+keyspace.OutName(r.token, len(ok), len(moved), r.outSeq.Add(1)), string(v)))
			size += len(v)
		}
		then = append(then, ops...)
		reqs = append(reqs, ackReq{cmps: cmps, then: then, kept: kept, size: size + 500, run: r, exact: exact || r.exact.Load()})
		ok, moved, ops, kept, size = nil, nil, nil, nil, 0
	}
	for _, o := range os {
		switch o.kind {
		case Cancelled:
			continue // the canceller or the lease took the task away
		case Succeeded:
			ok = append(ok, okSlot{Slot: o.c.slot, Attempt: o.c.task.Attempt, Result: o.result})
			size += len(o.result) * 4 / 3
		default:
			more, n := w.recordOps(o, now, markers)
			ops = append(ops, more...)
			moved = append(moved, o.c.slot)
			size += n
		}
		kept = append(kept, o)
		if len(kept) == SegmentSize || len(ops) >= 110 || size > maxRequestBytes/2 {
			flush()
		}
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
func (w *Worker) runRefused(req ackReq, extra []clientv3.Op) {
	r, q := req.run, w.cfg.Queue
	if len(req.kept) == 0 {
		return // a delete of the run alone: the run is gone already
	}
	var g *clientv3.TxnResponse
	var err error
	for try := 0; try < 3 && w.lease.Err() == nil; try++ {
		if try > 0 {
			time.Sleep(time.Duration(try) * 200 * time.Millisecond)
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
	markers := map[string]bool{}
	reqs, later := w.runReqs(r, left, req.final, true, time.Now().UTC(), markers)
	w.write(reqs, append(extra, markerOps(markers)...))
	if later && !r.lost.Load() {
		w.write([]ackReq{w.runDelete(r)}, nil)
	}
}

// runEnded closes the segment of run r, which took its last free slots,
// once every slot has finished.
func (w *Worker) runEnded(r *segRun) {
	ctx, cancel := context.WithTimeout(w.lease.Context(), 10*time.Second)
	defer cancel()
	st, err := w.client.readState(ctx, w.cfg.Queue, r.seg)
	if err == nil && st.open && st.done() {
		w.client.closeSegment(ctx, w.cfg.Queue, st)
	}
}
