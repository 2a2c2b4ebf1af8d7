package queue

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/internal/taskstore"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/tracing/otelspan"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// runClaim is the claim of slots pick of segment st, whose tasks are ts,
// as one nested transaction (op): cmps, the segment's, and inside them
// runners, that no task runner holds any of the tasks, then its writes.
type runClaim struct {
	w              *claimer
	st             *segState
	ts             []Task
	pick           []int
	last           bool
	v              runValue
	rv             []byte // v encoded
	runKey, tryKey string
	now            time.Time
	cmps, runners  []clientv3.Cmp
	then           []clientv3.Op
	// call and free, for a run of a combined claim (brokerclaim.go): the
	// claim it serves, and the segment's free slots it picked from.
	call *claimCall
	free []int
	// paused: the pause fence refused the claim (result).
	paused bool
	// made and made0, once sent: the run was made, and its segRun.
	made  bool
	made0 *segRun
}

// prepareRun is the transaction that writes the run of pick: a run key
// bound to w's lease and its try, required that no run was made, no
// outcome of a run made since written and no slot exited since st was
// read, that the segment is open, and that no task runner holds any of
// the tasks.
func (w *claimer) prepareRun(st *segState, ts []Task, pick []int, last bool) *runClaim {
	q, seg := w.queue, st.name
	now := time.Now().UTC()
	v := runValue{Worker: w.worker, ClaimedAt: now, Slots: pick, Attempts: make([]int, len(pick))}
	for i, s := range pick {
		v.Attempts[i] = st.attempts(s) + 1
	}
	rv := v.Encode()
	name := keyspace.RunName(len(pick), w.runID, w.runSeq.Add(1))
	rc := &runClaim{w: w, st: st, ts: ts, pick: pick, last: last, v: v, rv: rv, now: now,
		runKey: w.keys.Run(q, seg, name), tryKey: w.keys.Try(q, seg, name)}
	rc.cmps = []clientv3.Cmp{
		w.client.notPaused(q), // the pause fence (pause.go)
		clientv3.Compare(clientv3.ModRevision(w.keys.Runs(q, seg)).WithPrefix(), "<", st.rev+1),
		// A run made since and already ended (its lease gone) leaves
		// only its try, which counts the attempt it started.
		clientv3.Compare(clientv3.ModRevision(w.keys.Tries(q, seg)).WithPrefix(), "<", st.rev+1),
		clientv3.Compare(clientv3.ModRevision(w.keys.Exits(q, seg)).WithPrefix(), "<", st.rev+1),
		// A run made and finished since the read left outcomes (runs
		// older than the read hold slots the read did not take).
		clientv3.Compare(clientv3.CreateRevision(w.keys.OutsFrom(q, seg, st.rev+1)), "=", 0).WithRange(clientv3.GetPrefixRangeEnd(w.keys.Outs(q, seg))),
		clientv3.Compare(clientv3.CreateRevision(w.keys.SegmentOpen(q, seg)), ">", 0),
	}
	rc.then = []clientv3.Op{clientv3.OpPut(rc.runKey, string(rv), clientv3.WithLease(w.lease.ID())), clientv3.OpPut(rc.tryKey, string(rv))}
	for _, tr := range st.coveredTries(pick) {
		rc.then = append(rc.then, clientv3.OpDelete(tr.key))
	}
	// A task id is held by one claimer at a time, a queue worker or a task
	// runner (package task): no claim while the runner's lock on one of
	// the ids has a holder or a waiter.
	for _, s := range pick {
		rc.runners = append(rc.runners, taskstore.NoRunner(taskstore.RunnerLock(w.keys, ts[s].ID)))
	}
	return rc
}

// op is rc's transaction as an operation: the segment's compares outside,
// the runners' inside, so that a refusal says which of them failed
// (runClaim.result) without a read per task in the request. Reads of each
// task's lock in the request, to tell which task a runner holds when one
// does, cost a tenth of the worker's claim throughput (docs/bench-log/queue.md);
// that rare case reads them afterwards (runClaim.findRunners).
func (rc *runClaim) op() clientv3.Op {
	return clientv3.OpTxn(rc.cmps, []clientv3.Op{clientv3.OpTxn(rc.runners, rc.then, nil)}, []clientv3.Op{rc.w.client.ifPaused(rc.w.queue)})
}

// result reads the answer r to op: whether the claim was made, and when
// not, whether it was a task runner holding one of the tasks that refused
// it (rather than a change of the segment since its read). A claim the
// pause fence refused sets rc.paused.
func (rc *runClaim) result(r *pb.TxnResponse) (made, runnerHeld bool) {
	if r != nil && !r.Succeeded && len(r.Responses) > 0 {
		rc.paused = rc.w.client.refusedBy(rc.w.queue, (*clientv3.GetResponse)(r.Responses[0].GetResponseRange()))
	}
	if r == nil || !r.Succeeded || len(r.Responses) == 0 {
		return false, false
	}
	inner := r.Responses[0].GetResponseTxn()
	return inner.GetSucceeded(), !inner.GetSucceeded()
}

// findRunners reads which of rc's tasks a task runner holds, after a
// claim refused for it: they are left out of claims for a while
// (Worker.runnerHolds) instead of refusing the next claim again.
func (rc *runClaim) findRunners(ctx context.Context) {
	ops := make([]clientv3.Op, len(rc.pick))
	for i, s := range rc.pick {
		ops[i] = taskstore.CountRunners(taskstore.RunnerLock(rc.w.keys, rc.ts[s].ID))
	}
	resp, err := rc.w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return // the next claim is refused again and reads again
	}
	for i, r := range resp.Responses {
		if r.GetResponseRange().Count > 0 {
			rc.w.runnerHolds(rc.ts[rc.pick[i]].ID)
		}
	}
}

// claimed returns the claims of rc, written at revision rev (its token).
func (rc *runClaim) claimed(rev int64) []*claim {
	w, q := rc.w, rc.w.queue
	run := &segRun{seg: rc.st.name, runKey: rc.runKey, tryKey: rc.tryKey, token: rev, claimedAt: rc.now, v: rc.v, last: rc.last,
		writer: int(w.runSeq.Load() % claimers)}
	run.remaining.Store(int32(len(rc.pick)))
	out := make([]*claim, len(rc.pick))
	for i, s := range rc.pick {
		t, _ := taskOf(rc.ts, s)
		t.Queue = q
		t.Transitions = submittedHistory(rc.st.name, t.Metadata.CreatedAt)
		t.Attempt, t.Token, t.CurrentStatus = rc.v.Attempts[i], run.token, Running
		out[i] = &claim{task: t, claimKey: rc.runKey, token: run.token, claimedAt: rc.now, run: run, slot: s}
		metrics.TasksClaimed.WithLabelValues(q, t.Type).Inc()
	}
	w.claimed.Add(int64(len(out)))
	metrics.ClaimBatchSize.WithLabelValues(q).Observe(float64(len(out)))
	return out
}

// resolve finds out what became of rc's claim when its request failed
// without an answer (the connection to the leader broke, the leader
// changed): etcd may have applied it, and then a run nobody knows holds
// its tasks RUNNING until the lease ends, which for a live worker is
// never. One transaction settles it either way: when the run exists, it
// is read and adopted (its claims returned, to run as usual); when it
// does not, its try is written, as a dead run's would be, so that the
// request, should it still arrive, is refused (its comparisons require no
// try written since its read) and the attempt it would have started is
// counted. It tries while the lease lives, for up to claimResolveFor;
// nil claims: none were made (or it could not tell, and the tasks come
// back when the lease ends).
func (rc *runClaim) resolve() []*claim {
	w := rc.w
	deadline := time.Now().Add(claimResolveFor)
	for try := 0; time.Now().Before(deadline) && w.lease.Err() == nil; try++ {
		if try > 0 {
			_ = lifecycle.Sleep(w.lease.Context(), min(time.Duration(try)*200*time.Millisecond, time.Second)) // ends early when the lease is lost
		}
		ctx, cancel := context.WithTimeout(w.lease.Context(), 5*time.Second)
		resp, err := w.cli.Txn(ctx).
			If(clientv3.Compare(clientv3.CreateRevision(rc.runKey), ">", 0)).
			Then(clientv3.OpGet(rc.runKey)).
			Else(clientv3.OpPut(rc.tryKey, string(rc.rv))).Commit()
		cancel()
		if err != nil {
			continue
		}
		if !resp.Succeeded {
			return nil
		}
		kvs := resp.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 || kvs[0].Lease != int64(w.lease.ID()) {
			return nil
		}
		w.logger.Info("queue: a claim whose answer was lost had been made; its tasks run here", "segment", rc.st.name, "tasks", len(rc.pick))
		return rc.claimed(kvs[0].CreateRevision)
	}
	w.logger.Error("queue: could not tell whether a claim whose answer was lost was made; its tasks, if it was, run again when this worker's lease ends", "segment", rc.st.name, "tasks", len(rc.pick))
	return nil
}

// claimResolveFor bounds how long a worker tries to find out what became
// of a claim whose answer was lost (runClaim.resolve).
const claimResolveFor = 15 * time.Second

// outcomeUnknown reports whether a request that failed with err may have
// been applied all the same: the connection broke, the leader changed or
// the request timed out. etcd's refusals (a lease not found, a request too
// large, no space) are answers: nothing was applied.
func outcomeUnknown(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return true
	}
	var ee rpctypes.EtcdError
	if errors.As(err, &ee) {
		return unknownCode(ee.Code()) // leader changed, request timed out: Unavailable
	}
	if st, ok := status.FromError(err); ok {
		return unknownCode(st.Code()) // a broken connection: Unavailable
	}
	return false
}

// unknownCode reports whether a request that failed with code may have
// been applied.
func unknownCode(code codes.Code) bool {
	switch code {
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Aborted:
		return true
	}
	return false
}

// startAttempt starts the span of claimed task c's attempt (package
// tracing): a child of the task's creation context, linked to it, from
// the claim's time. When the span records, it also records the queue wait
// before the claim and the attempts before it that were lost.
func (w *Worker) startAttempt(base context.Context, c *claim) (context.Context, trace.Span) {
	t := c.task
	ctx, parent, span := w.spans.Start(base, t.TraceParent, c.claimedAt)
	if !span.IsRecording() {
		return ctx, span
	}
	a := otelspan.Attempt{TaskID: t.ID, TaskType: t.Type, Tenant: t.Metadata.Tenant, Number: t.Attempt,
		Ready: waitStart(t.Metadata.CreatedAt, c.claimedAt), Claimed: c.claimedAt, Deferrals: t.Deferrals}
	if n := len(t.Transitions); n > 0 && t.Transitions[n-1].At.After(a.Ready) {
		last := t.Transitions[n-1] // a retry, a deferral, a requeue: the wait since
		a.Ready, a.WaitAfter = last.At, string(last.Status)
		if last.Status != Retrying { // a retry's error is its attempt's span's, which may hold a command's stderr
			a.WaitReason = last.Error // a deferral's reason, cut by Describe
		}
	} else if t.ScheduledAt.After(a.Ready) {
		a.WaitAfter = string(Scheduled) // submitted to run later
	}
	ts := slices.Clip(t.Transitions)
	for _, tr := range appendLost(ts, t.Attempt, c.claimedAt)[len(ts):] {
		a.Lost = append(a.Lost, tr.Attempt)
	}
	return w.spans.Describe(ctx, parent, span, &a), span
}

// claimed notes a claim call that began at began, asked for asked tasks
// and got claims or failed with err: its time, and while tracing is on
// its "receive <queue>" span, linked to the claimed tasks' creation
// contexts that were sampled (otelspan.Consumer.Receive); a claim that
// found nothing makes none, nor one that failed because stop ended (the
// worker stopping: no failure, which the loop neither logs nor retries).
func (w *Worker) claimed(stop, base context.Context, began time.Time, asked int, claims []*claim, err error) {
	if err == nil {
		sample(&w.claimTime, time.Since(began))
	} else if stop.Err() != nil && len(claims) == 0 {
		return
	}
	if !w.spans.On() || len(claims) == 0 && err == nil {
		return
	}
	w.spans.Receive(base, began, asked, len(claims), func(i int) string {
		if t := claims[i].task; t != nil {
			return t.TraceParent
		}
		return ""
	}, err)
}

// maxWaitSpan bounds the wait span a task's creation time starts.
const maxWaitSpan = 7 * 24 * time.Hour

// waitStart is when a task created at created (its metadata's, which its
// submitter may set, from another clock) began to wait for a claim at
// claimed: never after the claim, nor more than maxWaitSpan before it.
func waitStart(created, claimed time.Time) time.Time {
	if created.After(claimed) {
		return claimed // no wait span
	}
	if earliest := claimed.Add(-maxWaitSpan); created.Before(earliest) {
		return earliest
	}
	return created
}

// endAttempt ends an attempt's span with its outcome o.
func endAttempt(span trace.Span, o outcome) {
	if !span.IsRecording() {
		span.End()
		return
	}
	end := otelspan.EndCancelled
	switch o.kind {
	case Succeeded:
		end = otelspan.EndSuccess
	case Retrying:
		end = otelspan.EndRetry
	case Dead:
		end = otelspan.EndDead
	case Sleeping:
		end = otelspan.EndSleep
	case Waiting:
		end = otelspan.EndWait
	case Pending:
		end = otelspan.EndHandedBack
		if o.deferred != "" {
			end = otelspan.EndDeferred
		}
	case Cancelled:
		if errors.Is(o.err, lock.ErrLost) || errors.Is(o.err, lease.ErrLost) {
			end = otelspan.EndLost
		}
	}
	otelspan.EndProcess(span, end, o.err)
}
