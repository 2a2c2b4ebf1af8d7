package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/groupcommit"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
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
}

// Reported is how one outcome of a Report went: Task is the task as the
// outcome left it (SUCCEEDED, RETRYING or DEAD), or Err says why nothing
// of it was written: an error matching lease.ErrFenced when its claim no
// longer holds (or the same claim was reported twice at once), ErrNotFound when
// its queue has no such task, or the store's error.
type Reported struct {
	Task *Task
	Err  error
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

// reportRecord records outcome o of a task with a record of its own (or
// finds that its claim no longer holds), as Ack and Fail did before runs.
func (b *broker) reportRecord(ctx context.Context, o Outcome) Reported {
	verb := "ack"
	if o.Failed {
		verb = "fail"
	}
	t, err := b.settle(ctx, o.Held, verb, func(w *Worker, cl *claim) (outcome, error) {
		return decideOutcome(w, cl.task, o), nil
	})
	if err != nil {
		return Reported{Err: err}
	}
	switch {
	case t.CurrentStatus == Sleeping:
		b.retryAt(o.Queue, t.ScheduledAt)
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
// task.MaxChildResult).
func decideOutcome(w *Worker, t *Task, o Outcome) outcome {
	if !o.SleepUntil.IsZero() {
		return outcome{kind: Sleeping, until: o.SleepUntil}
	}
	if !o.Failed && t.Parent != "" && len(o.Result) > task.MaxChildResult {
		return outcome{kind: Dead, err: childResultError(len(o.Result))} // as an in-process worker's (execute)
	}
	if !o.Failed {
		return outcome{kind: Succeeded, result: o.Result}
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
