package agentserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// One active run per thread. A run is admitted when its queue task is
// submitted (only an admitted run can be claimed), and every admission is
// a transaction that compares the thread's revision with the one read
// beside the thread's runs: two admissions on one thread conflict, and
// the one retried sees the other's run. An enqueued run waits unadmitted
// (queued, no task) until the admitted one ends; then the end admits the
// oldest queued run. interrupt and rollback stop the admitted run:
// its task is cancelled (the queue takes its claim away, so its stream
// refuses its late events), the thread's lock (checkpoint admission's,
// keyspace.ThreadLock) is taken from it (its late checkpoint writes,
// fenced by that lock, are refused), and the admission's interrupt key is
// written; rollback then deletes its checkpoints. The stop comes after
// the transaction that admits the new run (and writes the stopped runs
// ended, or deletes them) and before its task is submitted: a create
// that fails stops nothing, and the new run never runs beside them.

// maxStopped bounds the runs one create stops (those of the thread not
// ended: the admitted one and the queued ones), so that its transaction
// (a compare and two writes per run) stays within maxTxnOps.
const maxStopped = 60

// strategies are the multitask strategies served.
var strategies = map[string]bool{"reject": true, "enqueue": true, "interrupt": true, "rollback": true}

// threadRuns reads thread's runs not ended, and those of also, with
// their revisions, their statuses as their tasks have them (runs whose
// task ended are settled on the way). It reads the thread's index of
// active runs, at most maxStopped+1 of them, never its history.
func (s *server) threadRuns(ctx context.Context, thread string, also map[string]runRecord) ([]runRecord, []int64, error) {
	out, revs, err := s.activeRecords(ctx, thread, also)
	if err != nil {
		return nil, nil, err
	}
	ptrs := make([]*runRecord, len(out))
	for i := range out {
		ptrs[i] = &out[i]
	}
	if err := s.withTaskStatus(ctx, ptrs, revs); err != nil {
		return nil, nil, err
	}
	return out, revs, nil
}

// activeRecords reads the records of thread's active runs (by its index,
// newest first, at most maxStopped+1) and of the runs also names, with
// their revisions: the index in one read, the records in a second (so a
// run that ends between the two is read ended, and one admitted between
// them is missed; the caller read the thread before, and that admission
// changed it). An index key whose record is gone or ended is skipped.
func (s *server) activeRecords(ctx context.Context, thread string, also map[string]runRecord) ([]runRecord, []int64, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, nil, err
	}
	if err := s.ensureRunIndex(ctx, sp); err != nil {
		return nil, nil, err
	}
	idx, err := s.cfg.Etcd.Get(ctx, sp.AgentActiveRuns(thread), clientv3.WithPrefix(), clientv3.WithKeysOnly(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(maxStopped+1))
	if err != nil {
		return nil, nil, etcdError("reading the thread's active runs", err)
	}
	ids := map[string]bool{}
	var gets []clientv3.Op
	for _, kv := range idx.Kvs {
		ids[idOf(kv.Key)] = true
		gets = append(gets, clientv3.OpGet(sp.AgentRun(thread, idOf(kv.Key))))
	}
	for id := range also {
		if !ids[id] {
			gets = append(gets, clientv3.OpGet(sp.AgentRun(thread, id)))
		}
	}
	if len(gets) == 0 {
		return nil, nil, nil
	}
	resp, err := s.cfg.Etcd.Txn(ctx).Then(gets...).Commit()
	if err != nil {
		return nil, nil, etcdError("reading the thread's active runs", err)
	}
	var out []runRecord
	var revs []int64
	for _, r := range resp.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			var rec runRecord
			if err := json.Unmarshal(kv.Value, &rec); err != nil {
				return nil, nil, undecodable("run", idOf(kv.Key), err)
			}
			if _, named := also[rec.RunID]; rec.Ended && !named {
				continue
			}
			out, revs = append(out, rec), append(revs, kv.ModRevision)
		}
	}
	return out, revs, nil
}

// errMoved: another run took the thread while runs were being stopped;
// the caller reads the thread again (and stops that run too).
var errMoved = errors.New("agentserver: another run took the thread")

// stopRuns stops runs of thread for a new run (or a cancel): their tasks
// cancelled, the thread's lock taken from whoever holds it, the
// admission's interrupt key written, and with rollback their checkpoints
// deleted. Each step may be repeated. errMoved when a run not among them
// (nor admitted, the new run that stops them) is admitted, or when
// admitted's task is submitted: whoever submitted it had stopped them.
func (s *server) stopRuns(ctx context.Context, thread string, runs []runRecord, rollback bool, admitted string) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	q, err := s.queueOf(ctx)
	if err != nil {
		return err
	}
	defer closeQueue(q)
	ids := map[string]bool{}
	for _, r := range runs {
		ids[r.RunID] = true
		if r.Queued || r.Ended {
			continue
		}
		if err := cancelRunTask(ctx, q, r); err != nil {
			return err
		}
	}
	// After the cancels: a runtime that takes the lock after this delete
	// reads its task cancelled and runs nothing.
	if err := s.takeThread(ctx, sp, thread, ids, admitted); err != nil {
		return err
	}
	if !rollback {
		return nil
	}
	for _, r := range runs {
		if err := s.deleteRunCheckpoints(ctx, sp, thread, r.RunID); err != nil {
			return err
		}
	}
	return nil
}

// cancelRunTask cancels admitted run r's task. A run admitted whose task
// is not there yet (its create, or admitNext, submits it after the
// admission) gets a placeholder task of its id, due far ahead and
// cancelled at once: the late submit then finds its id taken (submitRun
// and ensureTask take that as submitted), and the run never runs.
func cancelRunTask(ctx context.Context, q *queue.Client, r runRecord) error {
	_, err := q.Cancel(ctx, r.RunID)
	if err == nil || !errors.Is(err, queue.ErrNotFound) {
		if err != nil && !isFinished(err) {
			return etcdError("cancelling the thread's run", err)
		}
		return nil
	}
	ph := queue.Task{ID: r.RunID, Type: r.GraphID, Parameters: json.RawMessage(`{"stopped_before_submitted":true}`), Delay: queue.Duration(placeholderDelay)}
	// A refusal is the run's own task come in meanwhile: cancelled below.
	if _, err := q.Submit(ctx, RunsQueue, []queue.Task{ph}, nil); err != nil {
		return etcdError("fencing the stopped run's task", err)
	}
	if _, err := q.Cancel(ctx, r.RunID); errors.Is(err, queue.ErrNotFound) {
		return etcdError("fencing the stopped run's task", err)
	} else if err != nil && !isFinished(err) {
		return etcdError("cancelling the thread's run", err)
	}
	return nil
}

// placeholderDelay is how far ahead a stopped run's placeholder task is
// due: it is cancelled at once, and must not be claimed before.
const placeholderDelay = 24 * time.Hour

// takeThread takes thread's lock from its holder and its waiters (their
// checkpoint writes under it are refused from now on), and writes the
// admission's interrupt request, which ends the context of a run
// admitted by checkpoint.Admitter on the thread; unless a run not among
// stopped (nor admitted) is admitted and not ended (errMoved): the lock
// may be its. The check and the taking are one transaction on the
// thread's revision, which also compares that admitted's task is not
// submitted (errMoved when it is): its runtime may hold the lock.
func (s *server) takeThread(ctx context.Context, sp keyspace.Space, thread string, stopped map[string]bool, admitted string) error {
	ctx = context.WithValue(ctx, admittingKey{}, true) // a run admitted now would move the thread
	for range maxAttempts {
		// The thread first, then its runs: an admission after this read
		// changes the thread, and the transaction below fails. (A read of
		// the runs that settles one writes the thread too: the next
		// attempt finds nothing to settle.)
		_, trev, err := s.getThread(ctx, thread)
		if err != nil {
			return err
		}
		runs, _, err := s.threadRuns(ctx, thread, nil)
		if err != nil {
			return err
		}
		for _, r := range runs {
			if !r.Ended && !r.Queued && !stopped[r.RunID] && r.RunID != admitted {
				return errMoved
			}
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(sp.AgentThread(thread)), "=", trev)}
		var orElse []clientv3.Op
		if admitted != "" {
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(sp.TaskIndex(admitted)), "=", 0))
			orElse = append(orElse, clientv3.OpGet(sp.TaskIndex(admitted), clientv3.WithKeysOnly()))
		}
		resp, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(
			clientv3.OpDelete(sp.Lock(keyspace.ThreadLock(thread)), clientv3.WithPrefix()),
			clientv3.OpPut(sp.CheckpointInterrupt(thread), s.now().Format(time.RFC3339Nano)),
		).Else(orElse...).Commit()
		if err != nil {
			return etcdError("taking the thread from its run", err)
		}
		if resp.Succeeded {
			return nil
		}
		if admitted != "" && len(resp.Responses[0].GetResponseRange().Kvs) > 0 {
			return errMoved
		}
	}
	return errRaced("the thread")
}

// deleteRunCheckpoints deletes the checkpoints run id wrote on thread
// (those whose metadata names it, in every checkpoint namespace) with
// their pending writes, and moves each namespace's head back to its
// newest checkpoint left (or removes it when none is left). The heads
// move first, in a transaction that compares each head with what was
// read (a head that moved meanwhile makes it read again), and with as
// many of the deletes as fit: a head never names a deleted checkpoint,
// and the deletes a crash left undone are found again by the run's id.
func (s *server) deleteRunCheckpoints(ctx context.Context, sp keyspace.Space, thread, id string) error {
	store, err := checkpoint.NewEtcd(s.cfg.Etcd, s.cfg.Namespace(ctx))
	if err != nil {
		return huma.NewError(http.StatusInternalServerError, "agentserver: "+err.Error())
	}
	for range maxAttempts { // a namespace of more than a page is deleted a page at a time
		cps, err := store.List(ctx, thread, "", checkpoint.ListOptions{AllNamespaces: true, Limit: 1000, Filter: map[string]any{"run_id": id}})
		if err != nil {
			return etcdError("listing the run's checkpoints", err)
		}
		if len(cps) == 0 {
			return nil
		}
		gone := map[string]map[string]bool{}
		var dels []clientv3.Op
		for _, cp := range cps {
			ns := keyspace.CheckpointNSName(cp.NS)
			if gone[cp.NS] == nil {
				gone[cp.NS] = map[string]bool{}
			}
			gone[cp.NS][cp.ID] = true
			dels = append(dels, clientv3.OpDelete(sp.CheckpointKey(thread, ns, cp.ID)),
				clientv3.OpDelete(sp.CheckpointWrites(thread, ns, cp.ID)+"/", clientv3.WithPrefix()))
		}
		cmps, heads, err := s.headMoves(ctx, sp, store, thread, gone)
		if err != nil {
			return err
		}
		n := min(len(dels), max(maxTxnOps-len(heads), 0))
		resp, err := s.cfg.Etcd.Txn(ctx).If(cmps...).Then(append(heads, dels[:n]...)...).Commit()
		if err != nil {
			return etcdError("deleting the run's checkpoints", err)
		}
		if !resp.Succeeded {
			continue // a head moved: read again
		}
		for dels = dels[n:]; len(dels) > 0; dels = dels[min(len(dels), maxTxnOps):] {
			if _, err := s.cfg.Etcd.Txn(ctx).Then(dels[:min(len(dels), maxTxnOps)]...).Commit(); err != nil {
				return etcdError("deleting the run's checkpoints", err)
			}
		}
	}
	return nil
}

// headMoves are the compares on the heads of thread's namespaces that
// lose the checkpoints gone names (each as read), and the writes that
// move each back to its newest checkpoint left, or delete it.
func (s *server) headMoves(ctx context.Context, sp keyspace.Space, store *checkpoint.Etcd, thread string, gone map[string]map[string]bool) ([]clientv3.Cmp, []clientv3.Op, error) {
	var cmps []clientv3.Cmp
	var ops []clientv3.Op
	for ns, ids := range gone {
		hk := sp.CheckpointHead(thread, keyspace.CheckpointNSName(ns))
		g, err := s.cfg.Etcd.Get(ctx, hk)
		if err != nil {
			return nil, nil, etcdError("reading the thread's head", err)
		}
		var rev int64
		if len(g.Kvs) > 0 {
			rev = g.Kvs[0].ModRevision
		}
		head, err := newestLeft(ctx, store, thread, ns, ids)
		if err != nil {
			return nil, nil, err
		}
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(hk), "=", rev))
		if head == "" {
			ops = append(ops, clientv3.OpDelete(hk))
		} else {
			ops = append(ops, clientv3.OpPut(hk, head))
		}
	}
	return cmps, ops, nil
}

// newestLeft is the id of the newest checkpoint of thread's namespace ns
// not among gone, or "".
func newestLeft(ctx context.Context, store *checkpoint.Etcd, thread, ns string, gone map[string]bool) (string, error) {
	cps, err := store.List(ctx, thread, ns, checkpoint.ListOptions{Limit: len(gone) + 1})
	if err != nil {
		return "", etcdError("reading the thread's checkpoints", err)
	}
	for _, cp := range cps {
		if !gone[cp.ID] {
			return cp.ID, nil
		}
	}
	return "", nil
}

// admitNext admits the oldest queued run of thread when none of its runs
// is admitted and not ended: in one transaction on the thread's revision
// it writes the run admitted and the thread busy, then submits its task.
// A run admitted whose task is missing (the submit after the transaction
// never happened) gets it.
func (s *server) admitNext(ctx context.Context, thread string) error {
	ctx = context.WithValue(ctx, admittingKey{}, true) // its reads' settles admit nothing
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	for range maxAttempts {
		th, trev, err := s.getThread(ctx, thread) // first: see takeThread
		if err != nil {
			return err
		}
		runs, revs, err := s.threadRuns(ctx, thread, nil)
		if err != nil {
			return err
		}
		next := -1
		for i, r := range runs { // newest first: the last queued is the oldest
			if r.Ended {
				continue
			}
			if !r.Queued {
				return s.ensureTask(ctx, r)
			}
			next = i
		}
		if next < 0 {
			return nil
		}
		r := runs[next]
		r.Queued, r.AdmittedAt, r.UpdatedAt = false, s.now(), s.now()
		th.Status, th.UpdatedAt = "busy", s.now()
		traw, _ := json.Marshal(th)
		rraw, _ := json.Marshal(r)
		rkey := sp.AgentRun(thread, r.RunID)
		resp, err := s.cfg.Etcd.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(sp.AgentThread(thread)), "=", trev),
			clientv3.Compare(clientv3.ModRevision(rkey), "=", revs[next]), storeguard.NotFull(sp)).
			Then(clientv3.OpPut(sp.AgentThread(thread), string(traw)), clientv3.OpPut(rkey, string(rraw))).
			Else(storeguard.GetOp(sp)).Commit()
		if err != nil {
			return etcdError("admitting the thread's next run", err)
		}
		if !resp.Succeeded {
			if err := guardOf(resp, 0); err != nil {
				return err
			}
			continue
		}
		return s.ensureTask(ctx, r)
	}
	return errRaced("the thread")
}

// finishStops stops the runs admitted run r stopped (interrupt,
// rollback) in the transaction that admitted it: their tasks cancelled,
// the thread's lock taken, with rollback their checkpoints deleted. It
// comes before r's task is submitted, by r's creator or by whoever finds
// r admitted without its task (its creator died in between), and may
// come twice: the lock is taken only while r's task is not submitted.
func (s *server) finishStops(ctx context.Context, r runRecord) error {
	if len(r.Stops) == 0 {
		return nil
	}
	runs := make([]runRecord, len(r.Stops))
	for i, o := range r.Stops {
		runs[i] = runRecord{Run: Run{RunID: o.RunID, ThreadID: r.ThreadID}, GraphID: o.GraphID, Queued: o.Queued}
	}
	if err := s.stopRuns(ctx, r.ThreadID, runs, r.RollbackStops, r.RunID); err != nil && !errors.Is(err, errMoved) {
		return err
	}
	return nil
}

// stopRef names a run that a new run stopped, for finishStops.
type stopRef struct {
	RunID   string `json:"run_id"`
	GraphID string `json:"graph_id"`
	Queued  bool   `json:"queued,omitempty"`
}

// admittingKey marks a context whose settles leave the admission of the
// thread's next run to their caller (admitNext, takeThread).
type admittingKey struct{}

// admitNextLogged admits thread's next enqueued run (see admitNext),
// logging a failure: the next read of that run, or create, retries.
func (s *server) admitNextLogged(ctx context.Context, thread string) {
	if err := s.admitNext(context.WithoutCancel(ctx), thread); err != nil {
		slog.Default().Warn("agentserver: admitting the thread's next run", "thread", thread, "err", err)
	}
}

// ensureTask submits admitted run r's task if it has none: the task of a
// run admitted from the queue, or one whose creator died before its
// submit (due when the run's delay says). Only within runGrace of its
// admission: a task missing later ended and was dropped by the queue's
// retention (or was never submitted, and the run is settled as an
// error), and submitting it again would run the graph a second time.
func (s *server) ensureTask(ctx context.Context, r runRecord) error {
	if !s.taskDue(r) {
		return nil
	}
	q, err := s.queueOf(ctx)
	if err != nil {
		return err
	}
	defer closeQueue(q)
	if _, err := q.Get(ctx, r.RunID); err == nil {
		return nil
	} else if !errors.Is(err, queue.ErrNotFound) {
		return etcdError("reading the run's task", err)
	}
	return s.submitMissingTask(ctx, q, r)
}

// taskDue reports whether run r is one whose task ensureTask submits when
// it is missing.
func (s *server) taskDue(r runRecord) bool {
	return len(r.Params) > 0 && !r.Ended && !r.Queued && s.now().Sub(admitted(&r)) <= runGrace
}

// submitMissingTask is ensureTask for a run whose task q was read missing
// already: the runs it stops stopped, then its task submitted.
func (s *server) submitMissingTask(ctx context.Context, q *queue.Client, r runRecord) error {
	if err := s.finishStops(ctx, r); err != nil {
		return err
	}
	res, err := q.Submit(ctx, RunsQueue, []queue.Task{{ID: r.RunID, Type: r.GraphID, Parameters: r.Params, Delay: queue.Duration(max(r.DueAt.Sub(s.now()), 0))}}, nil)
	if err == nil && len(res.Rejected) > 0 {
		if _, gerr := q.Get(ctx, r.RunID); gerr == nil { // another submitted it meanwhile
			return nil
		}
		err = errors.New(res.Rejected[0].Error)
	}
	if err != nil {
		return etcdError(fmt.Sprintf("submitting the task of run %s", r.RunID), err)
	}
	return nil
}

// awaitAdmitted returns once run id of thread is admitted with its task
// submitted, or ended (or gone), admitting it when its turn came and
// nobody did, and submitting its task when whoever admitted it died
// first: a join or stream that follows the task never finds it missing
// and answers early. ctx bounds it.
func (s *server) awaitAdmitted(ctx context.Context, thread, id string) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		resp, err := s.cfg.Etcd.Get(ctx, sp.AgentRun(thread, id))
		if err != nil {
			return etcdError("reading the run", err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var r runRecord
		if err := json.Unmarshal(resp.Kvs[0].Value, &r); err != nil {
			return undecodable("run", id, err)
		}
		if r.Ended {
			return nil
		}
		if !r.Queued { // admitted: its task is there, or its creator died before submitting it
			return s.ensureTask(ctx, r)
		}
		if err := s.admitNext(ctx, thread); err != nil {
			return err
		}
		// Wake on the record's change, or look again after a while: the
		// run before it may have ended without anyone admitting the next.
		// A watch that ends without a change (no leader, an error) waits
		// the while out: the loop never spins.
		wctx, cancel := context.WithTimeout(ctx, admitRecheck)
		changed := false
		for wr := range s.cfg.Etcd.Watch(clientv3.WithRequireLeader(wctx), sp.AgentRun(thread, id), clientv3.WithRev(resp.Header.Revision+1)) {
			changed = wr.Err() == nil && len(wr.Events) > 0
			break
		}
		if !changed {
			<-wctx.Done()
		}
		cancel()
	}
	return ctx.Err()
}

// admitRecheck is how often a waiter on a queued run checks whether its
// turn came without anyone admitting it.
var admitRecheck = 2 * time.Second
