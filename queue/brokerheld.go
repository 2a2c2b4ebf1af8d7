package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// held reads the claim h names and rebuilds it as the Worker that made it
// kept it: for a task with a record of its own, its claim key; for a task
// in a segment, the run holding its slot (and the segment's state, st). An
// error matching lease.ErrFenced says the claim no longer holds;
// ErrNotFound, that queue h.Queue has no task h.ID.
func (b *broker) held(ctx context.Context, h Held) (*Worker, *claim, *segState, error) {
	c := b.client
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.TaskRecord(h.ID)),
		clientv3.OpGet(c.keys.TaskIndex(h.ID)),
		clientv3.OpGet(c.keys.QueueClaim(h.Queue, h.ID)),
	).Commit()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("queue: read the claim of task %s: %w", h.ID, err)
	}
	rec := resp.Responses[0].GetResponseRange().Kvs
	idx := resp.Responses[1].GetResponseRange().Kvs
	if ck := resp.Responses[2].GetResponseRange().Kvs; len(ck) > 0 {
		kv := ck[0]
		if kv.CreateRevision != h.Token {
			return nil, nil, nil, fenced(h, "the task was claimed again since (its claim has another token)")
		}
		if h.Lease != 0 && kv.Lease != int64(h.Lease) {
			return nil, nil, nil, fenced(h, "the claim is bound to another session")
		}
		if len(rec) == 0 {
			return nil, nil, nil, fmt.Errorf("%w: %s (a claim without a record)", ErrNotFound, h.ID)
		}
		t := new(Task)
		if err := json.Unmarshal(rec[0].Value, t); err != nil {
			return nil, nil, nil, fmt.Errorf("queue: task record %s is unreadable: %w", h.ID, err)
		}
		fillStoredWait(t)
		var cv claimValue
		_ = json.Unmarshal(kv.Value, &cv)
		t.Attempt, t.Token, t.CurrentStatus = cv.Attempt, h.Token, Running
		w := b.outcomeWorker(h.Queue, cv.Worker)
		return w, &claim{task: t, recRev: rec[0].ModRevision, claimKey: string(kv.Key), pendingKey: c.pendingKey(t), token: h.Token, claimedAt: cv.ClaimedAt}, nil, nil
	}
	if len(rec) > 0 {
		var t Task
		if json.Unmarshal(rec[0].Value, &t) == nil && t.Queue != h.Queue {
			return nil, nil, nil, fmt.Errorf("%w: %s is in queue %s, not %s", ErrNotFound, h.ID, t.Queue, h.Queue)
		}
		return nil, nil, nil, fenced(h, "the task is not claimed (its claim ended: the session expired, the task was cancelled, or its outcome was written)")
	}
	if len(idx) == 0 {
		return nil, nil, nil, fmt.Errorf("%w: %s", ErrNotFound, h.ID)
	}
	at, ok := keyspace.ParseTaskPlace(string(idx[0].Value))
	if !ok || at.Queue != h.Queue {
		return nil, nil, nil, fmt.Errorf("%w: %s is not in queue %s", ErrNotFound, h.ID, h.Queue)
	}
	return b.heldInSegment(ctx, h, at)
}

// heldInSegment is held for a task in slot at of a segment.
func (b *broker) heldInSegment(ctx context.Context, h Held, at keyspace.TaskPlace) (*Worker, *claim, *segState, error) {
	c := b.client
	q, seg, slot := at.Queue, at.Segment, at.Slot
	st, err := c.readState(ctx, q, seg)
	if err != nil {
		return nil, nil, nil, err
	}
	r, attempt, live := st.runOf(slot)
	switch {
	case st.finished(slot):
		return nil, nil, nil, fenced(h, "the task's attempt has ended (its outcome was written, or it was cancelled)")
	case !live:
		return nil, nil, nil, fenced(h, "the task is not claimed (its claim ended with its session)")
	case r.token != h.Token:
		return nil, nil, nil, fenced(h, "the task was claimed again since (its claim has another token)")
	}
	if h.Lease != 0 {
		g, err := c.cli.Get(ctx, r.key)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("queue: read the claim of task %s: %w", h.ID, err)
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != h.Token {
			return nil, nil, nil, fenced(h, "the task is not claimed (its claim ended with its session)")
		}
		if g.Kvs[0].Lease != int64(h.Lease) {
			return nil, nil, nil, fenced(h, "the claim is bound to another session")
		}
	}
	ts, err := c.segmentTasks(ctx, q, seg)
	if err != nil {
		return nil, nil, nil, err
	}
	t, ok := taskOf(ts, slot)
	if !ok || t.ID != h.ID {
		return nil, nil, nil, fmt.Errorf("%w: %s (its segment is gone)", ErrNotFound, h.ID)
	}
	t.Queue = q
	t.Transitions = []Transition{{Status: Pending, At: t.Metadata.CreatedAt}}
	t.Attempt, t.Token, t.CurrentStatus = attempt, h.Token, Running
	run := &segRun{seg: seg, runKey: r.key, tryKey: c.keys.Try(q, seg, r.rest), token: r.token, claimedAt: r.v.ClaimedAt, v: r.v}
	// The run's outcome keys are told apart by a sequence number, which a
	// Worker counts in memory; here, the clock's (writeOutcome lets no
	// two outcomes of a run in at once).
	run.outSeq.Store(time.Now().UnixNano())
	w := b.outcomeWorker(q, r.v.Worker)
	return w, &claim{task: t, claimKey: r.key, token: r.token, claimedAt: r.v.ClaimedAt, run: run, slot: slot}, st, nil
}

// writeOutcome writes outcome o of one claim in one transaction, with the
// Worker's own writes: fenced by the claim (a task with a record of its
// own), or by the run, the slot's exit and the run's outcomes as st saw
// them (a task in a segment). When o ends the run's last slot, the run
// goes in the same transaction, and the segment closes once finished.
// The signals o consumes (o.spend) are consumed in it too (recordOps,
// runReqs; a park's in its nested transaction, waitOps). ok
// false: refused, nothing written (the claim is lost, or another outcome
// of the run got in first: read again).
func (w *Worker) writeOutcome(ctx context.Context, o outcome, st *segState) (ok bool, err error) {
	now := time.Now().UTC()
	markers := map[string]bool{}
	if o.c.run == nil {
		cmps, then, _ := w.ackOp(o, now, markers)
		resp, err := w.cli.Txn(ctx).If(cmps...).Then(append(then, markerOps(markers)...)...).Commit()
		if err != nil {
			return false, err
		}
		if resp.Succeeded {
			w.count(o)
		}
		return resp.Succeeded, nil
	}
	r, q := o.c.run, w.cfg.Queue
	final := true
	if held, _, ok := st.runOf(o.c.slot); ok {
		for _, s := range held.v.Slots {
			final = final && (s == o.c.slot || st.finished(s))
		}
	}
	reqs, _ := w.runReqs(r, []outcome{o}, final, true, now, markers)
	if len(reqs) != 1 {
		return false, fmt.Errorf("queue: %d requests for one outcome", len(reqs))
	}
	// No other outcome of the run since st was read: it would have made
	// this one the run's last, or be this one's twin.
	ownOuts := w.keys.RunOuts(q, r.seg, r.token)
	cmps := append(reqs[0].cmps, clientv3.Compare(clientv3.ModRevision(ownOuts).WithPrefix(), "<", st.rev+1))
	resp, err := w.cli.Txn(ctx).If(cmps...).Then(append(reqs[0].then, markerOps(markers)...)...).Commit()
	if err != nil {
		return false, err
	}
	if !resp.Succeeded {
		return false, nil
	}
	w.count(o)
	if final && len(st.runs) == 1 && slices.ContainsFunc(st.runs, func(x runRef) bool { return x.key == r.runKey }) {
		// The segment's only run ended: close the segment if finished.
		if now, err := w.client.readState(ctx, q, r.seg); err == nil && now.open && now.done() {
			w.client.closeSegment(ctx, q, now)
		}
	}
	return true, nil
}

// Heartbeat checks that the claim h still holds, and returns its task,
// RUNNING. An error matching lease.ErrFenced says it does not: the lease
// ended, the task was cancelled, or its outcome was written.
func (c *Client) Heartbeat(ctx context.Context, h Held) (*Task, error) {
	if err := h.check(); err != nil {
		return nil, err
	}
	_, cl, _, err := c.remote.held(ctx, h)
	if err != nil {
		return nil, err
	}
	return cl.task, nil
}

// Ack records that the claimed task h succeeded with result (at most
// MaxResult bytes), and returns it, SUCCEEDED. An error matching
// lease.ErrFenced says the claim no longer holds and nothing was written.
func (c *Client) Ack(ctx context.Context, h Held, result []byte) (*Task, error) {
	return c.remote.reportOne(ctx, Outcome{Held: h, Result: result})
}

// Fail records that the claimed task h failed with reason: a permanent
// failure, or a transient one past the task's retry budget, sends it to
// the dead-letter queue; a transient one schedules a retry after the
// task's backoff (full jitter; a Worker's defaults, 1 s and 5 m, unless the
// task sets its own). It returns the task, RETRYING (with ScheduledAt) or
// DEAD. An error matching lease.ErrFenced says the claim no longer holds
// and nothing was written.
func (c *Client) Fail(ctx context.Context, h Held, reason string, permanent bool) (*Task, error) {
	return c.remote.reportOne(ctx, Outcome{Held: h, Failed: true, Error: reason, Permanent: permanent})
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
	t, err := c.remote.settle(ctx, h, "hand back", func(*Worker, *claim) (outcome, error) {
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
func (b *broker) reportOne(ctx context.Context, o Outcome) (*Task, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	r := b.reportCombined(ctx, []Outcome{o})[0]
	return r.Task, r.Err
}

// settle writes the outcome decide gives for claim h, reading the claim
// again when a concurrent outcome of the same run got in first.
func (b *broker) settle(ctx context.Context, h Held, verb string, decide func(*Worker, *claim) (outcome, error)) (*Task, error) {
	c := b.client
	for try := 0; try < 20; try++ {
		w, cl, st, err := b.held(ctx, h)
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

// reportRecord records outcome o of a task with a record of its own (or
// finds that its claim no longer holds), as Ack and Fail did before runs,
// with the signals it consumes (o.spend).
func (b *broker) reportRecord(ctx context.Context, o Outcome) Reported {
	verb := "ack"
	switch {
	case o.Failed:
		verb = "fail"
	case o.Defer != nil:
		verb = "defer"
	}
	t, err := b.settle(ctx, o.Held, verb, func(w *Worker, cl *claim) (outcome, error) {
		return decideOutcome(w, cl.task, o), nil
	})
	if err != nil {
		return Reported{Err: err}
	}
	switch {
	case t.CurrentStatus == Sleeping, t.CurrentStatus == Waiting && t.ScheduledAt.Before(NoTimeout), o.Defer != nil:
		b.retryAt(o.Queue, t.ScheduledAt)
	case o.Wait != nil:
	case !o.SleepUntil.IsZero():
	case !o.Failed:
		succeeded(t, o.Result)
	case t.CurrentStatus == Retrying:
		b.retryAt(o.Queue, t.ScheduledAt)
	}
	return Reported{Task: t}
}

// decideOutcome is the outcome o reports of a claim of t: success, a
// retry after the task's backoff, or the dead-letter queue (a permanent
// failure, one past the retry budget, or a child's result larger than
// task.MaxChildResult). Only a success and a park consume the signals o
// received (o.spend): after the others the handler may start over. A
// deferral (o.Defer) hands the task back uncharged, as a gate's does; any
// other outcome ends the deferrals in a row (the task was admitted).
func decideOutcome(w *Worker, t *Task, o Outcome) outcome {
	if d := o.Defer; d != nil {
		return outcome{kind: Pending, err: d, delay: max(d.After, 100*time.Millisecond), deferred: d.Reason, deferLabel: externalDeferLabel(t, d.Reason)}
	}
	t.Deferrals = 0
	if !o.SleepUntil.IsZero() {
		return outcome{kind: Sleeping, until: o.SleepUntil}
	}
	if o.Wait != nil {
		return outcome{kind: Waiting, until: waitDue(o.Wait), wait: o.Wait, spend: o.spend}
	}
	if !o.Failed && t.Parent != "" && len(o.Result) > task.MaxChildResult {
		return outcome{kind: Dead, err: childResultError(len(o.Result))} // as an in-process worker's (execute)
	}
	if !o.Failed {
		return outcome{kind: Succeeded, result: o.Result, spend: o.spend}
	}
	reason := o.Error
	if strings.TrimSpace(reason) == "" {
		reason = "failed (no reason given)"
	}
	err := errors.New(reason)
	switch {
	case o.Permanent:
		return outcome{kind: Dead, err: Permanent(err)}
	case t.Attempt > t.Retries():
		return outcome{kind: Dead, err: err}
	}
	return outcome{kind: Retrying, err: err, delay: w.backoff(t)}
}

// ExternalDeferLabel labels in drover_tasks_deferred_total a deferral an
// external worker reported: "budget KEY" for a wait for the task's own
// budget (a reason "budget KEY: why"), "external" for any other reason,
// whose free text would make a series of each.
const ExternalDeferLabel = "external"

func externalDeferLabel(t *Task, reason string) string {
	kind, _, _ := strings.Cut(reason, ": ")
	if b := t.Metadata.Budget; b != "" && kind == "budget "+b {
		return kind
	}
	return ExternalDeferLabel
}

// fenced is the error of an outcome or heartbeat for a claim that no
// longer holds.
func fenced(h Held, why string) error {
	return fmt.Errorf("queue: task %s token %d: %w: %s", h.ID, h.Token, lease.ErrFenced, why)
}

// StreamClaim returns the claim h names as the writer of its task's
// stream (an external worker's emits, which its token proves). An error
// matching lease.ErrFenced says the claim no longer holds;
// ErrNotFound, that queue h.Queue has no task h.ID.
func (c *Client) StreamClaim(ctx context.Context, h Held) (stream.Claim, error) {
	if err := h.check(); err != nil {
		return stream.Claim{}, err
	}
	w, cl, _, err := c.remote.held(ctx, h)
	if err != nil {
		return stream.Claim{}, err
	}
	return stream.Claim{Task: h.ID, Attempt: cl.task.Attempt, Worker: w.worker, Fence: heldFence{token: h.Token, cmps: w.compares(cl)}}, nil
}

// heldFence is an external worker's claim as the writer of a stream.
type heldFence struct {
	token int64
	cmps  []clientv3.Cmp
}

func (f heldFence) Token() int64             { return f.token }
func (f heldFence) Compares() []clientv3.Cmp { return f.cmps }
func (f heldFence) Err() error               { return nil }

// The marks of an outcome request are puts it makes once at its top level
// whatever number of its outcomes call for them: a parent's wake mark, a
// priority level's marker. Each nested transaction carries the marks of
// its own outcomes, so that a request puts those of the ones it holds, and
// is split by them: etcd takes 128 operations a level.

// maxTxnOps is the most operations a request packs at its top level plus
// the widest of its nested transactions, within etcd's 128.
const maxTxnOps = 127

// setMarks gives every request of reqs the marks markers, those of the
// outcomes they record together.
func setMarks(reqs []ackReq, markers map[string]bool) {
	if len(markers) == 0 {
		return
	}
	keys := make([]string, 0, len(markers))
	for k := range markers {
		keys = append(keys, k)
	}
	for i := range reqs {
		reqs[i].marks = keys
	}
}

// marksOf are the puts of the marks of reqs, each key once.
func marksOf(reqs []ackReq) []clientv3.Op {
	seen := map[string]bool{}
	var out []clientv3.Op
	for _, r := range reqs {
		for _, k := range r.marks {
			if !seen[k] {
				seen[k] = true
				out = append(out, clientv3.OpPut(k, ""))
			}
		}
	}
	return out
}

// packReqs splits reqs into the requests etcd takes, in order, and calls
// send with each one's bounds: within maxRequestBytes, and with one
// operation a nested transaction plus the marks of them all, each once,
// plus the widest of them within maxTxnOps. A request alone over it is
// sent alone.
func packReqs(reqs []ackReq, send func(from, to int)) {
	from, size, width := 0, 0, 0
	marks := map[string]bool{}
	for k, r := range reqs {
		fresh := 0
		for _, m := range r.marks {
			if !marks[m] {
				fresh++
			}
		}
		if k > from && (size+r.size > maxRequestBytes || k-from+1+len(marks)+fresh+max(width, r.width()) > maxTxnOps) {
			send(from, k)
			from, size, width = k, 0, 0
			clear(marks)
		}
		size, width = size+r.size, max(width, r.width())
		for _, m := range r.marks {
			marks[m] = true
		}
	}
	if from < len(reqs) {
		send(from, len(reqs))
	}
}

// putMarks puts marks in requests of their own, for outcomes written in a
// request that had no room for them.
func putMarks(ctx context.Context, cli *clientv3.Client, marks []clientv3.Op) error {
	for len(marks) > 0 {
		n := min(len(marks), maxTxnOps)
		if _, err := cli.Txn(ctx).Then(marks[:n]...).Commit(); err != nil {
			return err
		}
		marks = marks[n:]
	}
	return nil
}

// outcomeName is the outcome a stream's Done (or an attempt's end) gives
// for status st: its name in lower case.
func outcomeName(st Status) string { return strings.ToLower(string(st)) }

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// FinishStream closes task id's stream with Done once the task ended
// with status st (an external worker's ack, a cancel): fenced by the
// stream alone, after whatever attempt wrote last; nothing when the
// stream has no events or already ends with Done.
func (c *Client) FinishStream(ctx context.Context, id string, st Status, cause string) error {
	return stream.For(c.cli, c.keys).Finish(ctx, id, outcomeName(st), cause)
}

// EndsStream is the option of stream Follow that ends a follower of
// task id's stream once the task is SUCCEEDED, DEAD or CANCELLED (or
// gone) and nothing more is stored: a task that ended without a done
// (cancelled while waiting to run again, its worker gone between its
// outcome and its done) ends its followers too. The wait for a late
// done counts from the task's end as stored (stream.WhenEndedAt): a
// follower of a task that ended long ago ends at once. every is how
// often an idle follower asks (0: stream.DefaultEndedCheck).
func (c *Client) EndsStream(id string, every time.Duration) stream.FollowOption {
	return stream.WhenEndedAt(func(ctx context.Context) (time.Time, bool) {
		t, err := c.Get(ctx, id)
		if err != nil || !t.CurrentStatus.Terminal() {
			return time.Time{}, errors.Is(err, ErrNotFound)
		}
		if t.StreamSettled {
			return stream.NoDoneFollows, true
		}
		return t.EndedAt(), true
	}, every)
}

// EndedAt is when the task ended, as its record says: the time of its
// last transition when that is to its status, SUCCEEDED, DEAD or
// CANCELLED; zero otherwise (not ended, or not known).
func (t *Task) EndedAt() time.Time {
	if n := len(t.Transitions); n > 0 && t.CurrentStatus.Terminal() && t.Transitions[n-1].Status == t.CurrentStatus {
		return t.Transitions[n-1].At
	}
	return time.Time{}
}
