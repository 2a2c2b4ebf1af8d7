package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/groupcommit"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// MaxReport is the most outcomes one Report takes.
const MaxReport = 256

// Outcome is what an external worker reports of one claim: success (Failed
// false) with Result (at most MaxResult bytes), or failure with Error,
// Permanent when retrying cannot help (see Fail).
type Outcome struct {
	Held
	Result    []byte
	Failed    bool
	Error     string
	Permanent bool
	// SleepUntil, when set, parks the task until then instead: SLEEPING,
	// its attempt not counted, and claimed again once it falls due.
	SleepUntil time.Time
	// Wait, when set, waits for the first of its signals, until its
	// Until (zero: no timeout): a signal that waits in the task's inbox
	// already (sent before the wait), other than those Received names,
	// is answered at once (Reported.Signal) without being consumed, and
	// so is the timeout of a wait whose Until passed; the claim then
	// holds still. With neither, the task parks WAITING, its attempt not
	// counted, until a signal or the timeout wakes it, as a step task's
	// wait does (wait.go).
	Wait *task.Wait
	// Defer, when set, hands the task back for Defer.After without
	// counting its attempt, as a Go worker's gate does with a
	// *drover.DeferError (a budget with no room): PENDING again, its
	// history saying "deferred: " and Defer.Reason (a budget's wait reads
	// it back), the deferrals in a row counted and the delay doubled with
	// each of them as there. A reason of at most MaxDeferReason bytes, a
	// delay of at most MaxDeferAfter.
	Defer *drover.DeferError
	// Received names the signals waits answered under this claim so
	// far (at most MaxReceived). A success, and a wait that parks, consume
	// those still in the inbox in their own write, fenced by the claim: a
	// claim that no longer holds consumes nothing, and a worker that dies
	// before its outcome leaves them to the next claim (delivered at least
	// once, consumed once). A park's next claim resumes at that wait; so
	// does the next claim after any other outcome (a retry, a sleep, a
	// failure to the dead-letter queue, a requeue after it, a park handed
	// back): they consume nothing and leave the task resuming where this
	// claim did (at the wait it was claimed after, or from the start), so
	// that a handler that runs over is answered the same signals again and
	// never needs one consumed. A wait answered at once skips them.
	Received []SignalRef
	// spend is what the outcome consumes of Received (report).
	spend *spending
}

// MaxReceived is the most signals one outcome names in Received.
const MaxReceived = 64

// MaxDeferReason is the longest reason of a deferral an outcome reports
// (Outcome.Defer), and MaxDeferAfter its longest delay.
const (
	MaxDeferReason = 1024
	MaxDeferAfter  = 24 * time.Hour
)

// SignalRef names a signal a task received: its name and the
// idempotency key it was sent with (Reported.Signal says both).
type SignalRef struct {
	Name           string
	IdempotencyKey string
}

// Reported is how one outcome of a Report went: Task is the task as the
// outcome left it (SUCCEEDED, RETRYING or DEAD), or Err says why nothing
// of it was written: an error matching lease.ErrFenced when its claim no
// longer holds (or the same claim was reported twice at once), ErrNotFound when
// its queue has no such task, or the store's error.
type Reported struct {
	Task *Task
	Err  error
	// Signal is what a wait (Outcome.Wait) was answered with at once: the
	// first signal waited for (not consumed: see Outcome.Received), or
	// its timeout; the task is still claimed (RUNNING) under the same
	// token.
	Signal *task.Signal
}

// check validates o; the fields it names are those of an Outcome.
func (o Outcome) check() error {
	if err := o.Held.check(); err != nil {
		return err
	}
	if len(o.Result) > MaxResult {
		return &drover.InputError{Field: "result", Value: fmt.Sprintf("%d bytes", len(o.Result)),
			Rule: fmt.Sprintf("must be at most %d bytes: put large outputs behind output_data_uri", MaxResult)}
	}
	if o.Failed && len(o.Result) > 0 {
		return &drover.InputError{Field: "result", Rule: "must be absent from a failure"}
	}
	if !o.SleepUntil.IsZero() && (o.Failed || len(o.Result) > 0) {
		return &drover.InputError{Field: "sleep", Rule: "must be alone: a task that sleeps neither succeeds nor fails"}
	}
	if err := o.checkDefer(); err != nil {
		return err
	}
	if o.Wait != nil {
		if o.Failed || len(o.Result) > 0 || !o.SleepUntil.IsZero() || o.Wait.Children != nil {
			return &drover.InputError{Field: "wait_signal", Rule: "must be alone: a task that waits neither succeeds, fails nor sleeps"}
		}
		if err := (&task.WaitRequest{Signals: o.Wait.Signals}).Check(); err != nil {
			return drover.Rename(err, "wait_signal.names")
		}
		if o.Wait.Until.After(time.Now().AddDate(task.MaxSleepYears, 0, 0)) {
			return &drover.InputError{Field: "wait_signal.until", Value: o.Wait.Until.Format(time.RFC3339),
				Rule: fmt.Sprintf("must end at most %d years from now", task.MaxSleepYears)}
		}
	}
	if len(o.Received) > MaxReceived {
		return &drover.InputError{Field: "received_signals", Value: len(o.Received), Rule: fmt.Sprintf("must name at most %d signals", MaxReceived)}
	}
	for i, r := range o.Received {
		at := fmt.Sprintf("received_signals[%d].", i)
		if err := task.CheckSignalName(r.Name); err != nil {
			return drover.Rename(err, at+"name")
		}
		if err := task.CheckIdempotencyKey(r.IdempotencyKey); err != nil {
			return drover.Rename(err, at+"idempotency_key")
		}
	}
	return nil
}

// checkDefer validates o's deferral, if any.
func (o Outcome) checkDefer() error {
	d := o.Defer
	switch {
	case d == nil:
		return nil
	case o.Failed || len(o.Result) > 0 || !o.SleepUntil.IsZero() || o.Wait != nil:
		return &drover.InputError{Field: "defer", Rule: "must be alone: a task handed back neither succeeds, fails, sleeps nor waits"}
	case strings.TrimSpace(d.Reason) == "" || len(d.Reason) > MaxDeferReason || !utf8.ValidString(d.Reason):
		return &drover.InputError{Field: "defer.reason", Value: len(d.Reason),
			Rule: fmt.Sprintf("must say why in 1 to %d bytes of UTF-8", MaxDeferReason)}
	case d.After < 0 || d.After > MaxDeferAfter:
		return &drover.InputError{Field: "defer.after", Value: d.After.String(), Rule: fmt.Sprintf("must be 0 to %s", MaxDeferAfter)}
	}
	return nil
}

// Report records the outcomes os of claims, each fenced by its token as Ack
// and Fail are, in as few transactions as a Worker takes: the outcomes of
// one run (the tasks of one claim in one segment) in one nested
// transaction, as many runs in a request as etcd allows. It answers each
// outcome apart, in order: a stale token fails its own outcome, not the
// others. The same claim reported twice counts once: the first report.
// An input error (nothing is written) names the outcome at fault,
// "outcomes[3].token".
func (c *Client) Report(ctx context.Context, os []Outcome) ([]Reported, error) {
	if len(os) == 0 || len(os) > MaxReport {
		return nil, &drover.InputError{Field: "outcomes", Value: len(os), Rule: fmt.Sprintf("must hold 1 to %d outcomes", MaxReport)}
	}
	for i, o := range os {
		if err := o.check(); err != nil {
			var ie *drover.InputError
			if errors.As(err, &ie) {
				return nil, &drover.InputError{Field: fmt.Sprintf("outcomes[%d].%s", i, strings.ReplaceAll(ie.Field, " ", "_")), Value: ie.Value, Rule: ie.Rule}
			}
			return nil, err
		}
	}
	return c.remote.reportCombined(ctx, os), nil
}

// report is Report on valid outcomes.
func (b *broker) report(ctx context.Context, os []Outcome) []Reported {
	out := make([]Reported, len(os))
	seen := make(map[Held]bool, len(os))
	todo := make([]int, 0, len(os))
	for i, o := range os {
		k := o.Held
		k.Lease = 0
		if seen[k] {
			out[i].Err = fenced(o.Held, "reported twice: the first report counts")
			continue
		}
		seen[k] = true
		todo = append(todo, i)
	}
	todo, read := b.deliverSignals(ctx, os, todo, out)
	todo = b.spendings(ctx, os, todo, read, out)
	todo, remembered := b.fromMemory(os, todo)
	// Outcomes the memory could not write go back with the rest, so that
	// each segment has one group: two writes of one run in one request
	// would each see the other's slots unfinished (etcd compares first).
	todo = append(todo, b.reportRemembered(ctx, os, remembered, out)...)
	groups, records, err := b.places(ctx, os, todo, out)
	if err != nil {
		for _, i := range todo {
			out[i].Err = err
		}
		groups, records = nil, nil
	}
	for _, i := range records {
		out[i] = b.reportRecord(ctx, os[i])
	}
	if len(groups) > 0 {
		b.reportSegments(ctx, os, groups, out)
	}
	return out
}

// places finds where the tasks of outcomes todo are: in a segment (grouped
// by segment, in order) or in a record of their own (records). An outcome
// of a task not found gets its error in out.
func (b *broker) places(ctx context.Context, os []Outcome, todo []int, out []Reported) (groups []*segGroup, records []int, err error) {
	c := b.client
	bySeg := map[string]*segGroup{}
	const perTxn = 40 // three reads each, within etcd's 128 operations
	for from := 0; from < len(todo); from += perTxn {
		part := todo[from:min(from+perTxn, len(todo))]
		ops := make([]clientv3.Op, 0, 3*len(part))
		for _, i := range part {
			h := os[i].Held
			ops = append(ops, clientv3.OpGet(c.keys.TaskRecord(h.ID), clientv3.WithKeysOnly()),
				clientv3.OpGet(c.keys.TaskIndex(h.ID)), clientv3.OpGet(c.keys.QueueClaim(h.Queue, h.ID), clientv3.WithKeysOnly()))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, nil, fmt.Errorf("queue: read the claims of %d tasks: %w", len(part), err)
		}
		for j, i := range part {
			h := os[i].Held
			rec := resp.Responses[3*j].GetResponseRange().Kvs
			idx := resp.Responses[3*j+1].GetResponseRange().Kvs
			claimed := resp.Responses[3*j+2].GetResponseRange().Kvs
			if len(rec) > 0 || len(claimed) > 0 {
				records = append(records, i) // held tells the rest
				continue
			}
			if len(idx) == 0 {
				out[i].Err = fmt.Errorf("%w: %s", ErrNotFound, h.ID)
				continue
			}
			at, ok := keyspace.ParseTaskPlace(string(idx[0].Value))
			if !ok || at.Queue != h.Queue {
				out[i].Err = fmt.Errorf("%w: %s is not in queue %s", ErrNotFound, h.ID, h.Queue)
				continue
			}
			k := at.Queue + "/" + at.Segment
			g := bySeg[k]
			if g == nil {
				g = &segGroup{q: at.Queue, seg: at.Segment, slots: map[int]int{}, tok: map[int]int64{}}
				bySeg[k] = g
				groups = append(groups, g)
			}
			g.items = append(g.items, i)
			g.slots[i], g.tok[i] = at.Slot, h.Token
		}
	}
	return groups, records, nil
}

// deliverSignals answers the waits among outcomes todo that end at once:
// a signal they wait for is in the task's inbox, or their timeout passed
// (deliverSignal). It returns the outcomes left to write, those that park,
// and, for each outcome, the revision its inbox was read at.
func (b *broker) deliverSignals(ctx context.Context, os []Outcome, todo []int, out []Reported) ([]int, []int64) {
	left, read := todo[:0:0], make([]int64, len(os))
	for _, i := range todo {
		if os[i].Wait == nil {
			left = append(left, i)
			continue
		}
		r, rev, done := b.deliverSignal(ctx, os[i])
		read[i] = rev
		if !done {
			left = append(left, i)
			continue
		}
		out[i] = r
	}
	return left, read
}

// deliverSignal answers wait o at once when it can, while its claim
// holds (lease.ErrFenced otherwise): the first signal it waits for in the
// task's inbox (in the order sent) that o.Received does not name, or its
// timeout when its Until passed. It consumes nothing: the outcome that
// ends the attempt names the signal and consumes it. false: neither, the
// task is to park; rev is the revision the inbox was read at.
func (b *broker) deliverSignal(ctx context.Context, o Outcome) (Reported, int64, bool) {
	c := b.client
	_, cl, _, err := b.held(ctx, o.Held)
	if err != nil {
		return Reported{Err: err}, 0, true
	}
	sg, rev, err := c.firstUnreceived(ctx, o.ID, o.Wait, o.Received)
	if err != nil {
		return Reported{Err: fmt.Errorf("queue: read the inbox of task %s: %w", o.ID, err)}, 0, true
	}
	if sg == nil {
		return Reported{}, rev, false
	}
	return Reported{Task: cl.task, Signal: sg}, rev, true
}

// SignalResult says what a Signal did.
type SignalResult struct {
	// IdempotencyKey is the key the signal was stored under (the one
	// given, or a random one).
	IdempotencyKey string `json:"idempotency_key"`
	// Stored: the signal was stored in the task's inbox. false: a signal
	// with that name and idempotency key was sent before (it waits in the
	// inbox or was consumed), and nothing was written.
	Stored bool `json:"stored"`
	// Woke: the task was parked waiting for the signal and is now pending.
	Woke bool `json:"woke"`
	// Status is the task's status as the signal found it.
	Status Status `json:"status"`
}

// Signals returns the signals task id received: those waiting to be
// consumed, in the order they were sent, then those consumed.
func (c *Client) Signals(ctx context.Context, id string) ([]task.SignalRecord, error) {
	return c.store.Signals(ctx, id)
}

// testHookBeforePark, when set by a test, runs before a wait that names
// signals received is parked (between the inbox's reads and the park).
var testHookBeforePark atomic.Pointer[func()]

// inboxValue is what an inbox key holds (task.EncodeSignal).
type inboxValue struct {
	Data json.RawMessage `json:"d,omitempty"`
	At   time.Time       `json:"at"`
}

// firstUnreceived is the first signal sent that wait wt waits for in task
// id's inbox, other than those received names (nil: none), or a timeout
// when wt's Until passed, and the revision the inbox was read at.
func (c *Client) firstUnreceived(ctx context.Context, id string, wt *task.Wait, received []SignalRef) (*task.Signal, int64, error) {
	skip := make(map[SignalRef]bool, len(received))
	for _, r := range received {
		skip[r] = true
	}
	ops := make([]clientv3.Op, len(wt.Signals))
	for i, n := range wt.Signals {
		ops[i] = clientv3.OpGet(c.keys.TaskSignalName(id, n), clientv3.WithPrefix(), clientv3.WithLimit(int64(len(skip)+1)),
			clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	}
	g, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, 0, err
	}
	var first *mvccpb.KeyValue
	var ref SignalRef
	for _, r := range g.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			name, idem, ok := keyspace.ParseTaskSignal(c.keys.TaskSignals(id), string(kv.Key))
			if !ok || skip[SignalRef{name, idem}] {
				continue
			}
			if first == nil || kv.CreateRevision < first.CreateRevision {
				first, ref = kv, SignalRef{name, idem}
			}
			break // the first of this name not received
		}
	}
	rev := g.Header.Revision
	if first != nil {
		var v inboxValue
		_ = json.Unmarshal(first.Value, &v)
		return &task.Signal{Name: ref.Name, IdempotencyKey: ref.IdempotencyKey, Data: v.Data, SentAt: v.At}, rev, nil
	}
	if !wt.Until.IsZero() && !wt.Until.After(c.now()) {
		return &task.Signal{TimedOut: true}, rev, nil
	}
	return nil, rev, nil
}

// spending is what an outcome consumes of the signals it names received:
// conditional writes, each made only while its signal is in the inbox as
// read, so that each is consumed once. A success makes them beside its
// own writes (recordOps, runReqs); a park, in its nested transaction
// (waitOps), so that a wait handed back at once consumes nothing.
type spending struct {
	ops  []clientv3.Op
	read int64 // the revision the inbox was read at before a park (0: none)
}

// consume are the writes of sp (none when nil).
func (sp *spending) consume() []clientv3.Op {
	if sp == nil {
		return nil
	}
	return sp.ops
}

// before is the revision a park's compares take (parkConds): 0 when
// nothing is consumed.
func (sp *spending) before() int64 {
	if sp == nil {
		return 0
	}
	return sp.read
}

// consumes reports whether outcome o may consume the signals it names
// received: a success, or a wait that parks (one answered at once was
// answered before). A failure (retried or dead) and a sleep consume
// nothing: the handler may start over.
func consumes(o Outcome) bool {
	return len(o.Received) > 0 && !o.Failed && o.SleepUntil.IsZero() && o.Defer == nil
}

// spendings reads the signals that the outcomes todo that may consume
// (consumes) name received, and sets each one's writes that consume those
// still in the inbox (Outcome.spend); read[i] is the revision a wait that
// parks read the inbox at (deliverSignal). A signal not in the inbox
// (consumed before, or never sent) is skipped. The reads of many outcomes
// share a transaction, so that outcomes naming signals are written
// together as the others are. It returns todo less the outcomes whose
// read failed, which get the error in out.
func (b *broker) spendings(ctx context.Context, os []Outcome, todo []int, read []int64, out []Reported) []int {
	c := b.client
	type ref struct {
		i int
		r SignalRef
	}
	var refs []ref
	parks := false
	for _, i := range todo {
		if !consumes(os[i]) {
			continue
		}
		parks = parks || os[i].Wait != nil
		os[i].spend = &spending{read: read[i]}
		seen := make(map[SignalRef]bool, len(os[i].Received))
		for _, r := range os[i].Received {
			if !seen[r] {
				seen[r] = true
				refs = append(refs, ref{i, r})
			}
		}
	}
	failed := map[int]error{}
	const perTxn = 120 // within etcd's 128 operations
	for from := 0; from < len(refs); from += perTxn {
		part := refs[from:min(from+perTxn, len(refs))]
		gets := make([]clientv3.Op, len(part))
		for k, x := range part {
			gets[k] = clientv3.OpGet(c.keys.TaskSignal(os[x.i].ID, x.r.Name, x.r.IdempotencyKey))
		}
		g, err := c.cli.Txn(ctx).Then(gets...).Commit()
		now := c.now()
		for k, x := range part {
			if err != nil {
				failed[x.i] = fmt.Errorf("queue: read the signals task %s received: %w", os[x.i].ID, err)
				continue
			}
			kvs := g.Responses[k].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			var v inboxValue
			_ = json.Unmarshal(kvs[0].Value, &v)
			sg := &task.Signal{Name: x.r.Name, IdempotencyKey: x.r.IdempotencyKey, SentAt: v.At}
			sp := os[x.i].spend
			sp.ops = append(sp.ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kvs[0].Key)), "=", kvs[0].ModRevision)},
				c.store.ConsumeOps(os[x.i].ID, sg, now), nil))
		}
	}
	if hook := testHookBeforePark.Load(); hook != nil && parks {
		(*hook)()
	}
	if len(failed) == 0 {
		return todo
	}
	return slices.DeleteFunc(todo, func(i int) bool {
		if err := failed[i]; err != nil {
			out[i].Err = err
			return true
		}
		return false
	})
}

// succeeded sets t as an ack with result left it.
func succeeded(t *Task, result []byte) {
	t.CurrentStatus, t.Result, t.LastError, t.RetriesAttempted = Succeeded, result, "", t.Attempt-1
}

// Outcomes reported at the same time by different external workers (the
// HTTP API's sessions, each with its own request) are written together: the
// first report to arrive while none is being written writes its own and
// every report that arrived meanwhile, in one report of up to MaxReport
// outcomes, and hands the writing on to the next one waiting. Each outcome
// is still fenced by its own claim and answered on its own; what the
// reports share is etcd's round trips: one read of where the tasks are, one
// of their runs, and one transaction that writes the outcomes of many runs,
// instead of three for each report. A report never waits for a timer: one
// that arrives alone is written at once (group commit).

// reportWriteTimeout bounds a combined report: it is not cut short by one
// reporter's context, since it writes the others' outcomes too.
const reportWriteTimeout = 30 * time.Second

// reportCombiner queues the reports of one Client that wait for the one
// being written. The zero value is ready.
type reportCombiner struct {
	line groupcommit.Line[*reportCall]
	// writes counts the combined reports written, reports the reports in
	// them.
	writes, reports atomic.Int64
}

// reportCall is one report: its outcomes, and their answers once written.
type reportCall struct {
	os  []Outcome
	out []Reported
}

// reportCombined is report, written together with the reports of other
// callers that arrive at the same time.
func (b *broker) reportCombined(ctx context.Context, os []Outcome) []Reported {
	rc := &b.reports
	call := &reportCall{os: os}
	if !rc.line.Join(call) {
		return call.out
	}
	// The next combined report: the first waiting, and those after it
	// while the outcomes stay within MaxReport.
	batch, calls := rc.line.Take(func(taken []*reportCall, next *reportCall) bool {
		size := len(next.os)
		for _, t := range taken {
			size += len(t.os)
		}
		return size <= MaxReport
	})
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), reportWriteTimeout)
	defer cancel()
	var all []Outcome
	for _, b := range batch {
		all = append(all, b.os...)
	}
	out := b.report(wctx, all)
	rc.writes.Add(1)
	rc.reports.Add(int64(len(batch)))
	for _, b := range batch {
		b.out, out = out[:len(b.os)], out[len(b.os):]
	}
	groupcommit.Answer(calls)
	rc.line.HandOn()
	return call.out
}
