package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// SubmitResult counts what a submission did. Rejected lists the tasks that
// were not valid, by their 1-based position (their line in a JSONL file).
type SubmitResult struct {
	Submitted  int         `json:"submitted"`
	Duplicates int         `json:"duplicates"`
	Rejected   []LineError `json:"rejected"`
}

// Submit adds tasks to queue q, in transactions of up to SubmitBatch tasks.
// A task whose id exists already is counted as a duplicate and left as it
// is, so submitting the same batch twice creates nothing new. Invalid tasks
// are listed in Rejected and the valid ones still go in. Up to four
// transactions are in flight at once, except for a queue with a maximum
// depth or in FIFO order, which takes one at a time. progress, if set, is
// called after each transaction with the number of tasks handled so far:
// from another goroutine, one call at a time, with growing numbers; it
// should return quickly.
func (c *Client) Submit(ctx context.Context, q string, tasks []Task, progress func(done int)) (SubmitResult, error) {
	res := SubmitResult{Rejected: []LineError{}}
	if err := CheckQueue(q); err != nil {
		return res, err
	}
	now := c.now()
	generated := false // some task was given its id here
	valid := make([]Task, 0, len(tasks))
	subs := make([]submitted, 0, len(tasks)) // valid[i] is tasks[subs[i].line-1]
	for i := range tasks {
		t := tasks[i]
		t.Queue = q
		if t.ID == "" {
			t.ID = NewID()
			generated = true
		}
		datedBySubmitter := !t.Metadata.CreatedAt.IsZero()
		if err := t.check(now); err != nil {
			res.Rejected = append(res.Rejected, LineError{Line: i + 1, Error: err.Error()})
			continue
		}
		t.CurrentStatus = Pending
		t.Transitions = []Transition{{Status: Pending, At: now.UTC()}}
		valid = append(valid, t)
		subs = append(subs, submitted{line: i + 1, dated: datedBySubmitter})
	}
	done := len(tasks) - len(valid)
	seen := make(map[string]int, len(valid)) // id → its first index in valid
	var ops, markers []clientv3.Op
	var idx []int // idx[k] is the index in valid of the task of ops[k]
	named := false
	levels := map[string]bool{}
	size := 0
	depth, err := c.depthGuard(ctx, q)
	if err != nil {
		return res, err
	}
	for i := range valid {
		valid[i].Shard = nil // drover's to set, not the submitter's
		if depth.fifo {
			zero := 0
			valid[i].Shard = &zero
		}
	}
	// A queue without a maximum depth takes several requests in flight
	// (etcd commits them in one batch, where one at a time leaves it
	// waiting on the round trip); with a maximum depth each request waits
	// for the room its predecessor left, so they go one at a time.
	// A FIFO queue also takes one at a time: a claimer must never see a
	// later request's tasks before an earlier one's.
	inFlight := submitInFlight
	if depth.max > 0 || depth.fifo {
		inFlight = 1
	}
	// A failed request does not cancel the others in flight: what they
	// submitted is counted.
	var g errgroup.Group
	g.SetLimit(inFlight)
	var mu sync.Mutex // guards res, done, depth, failed and progress below
	failed := false
	send := func(batch []clientv3.Op, sent []int) error {
		began := time.Now()
		resp, err := c.cli.Txn(ctx).Then(batch...).Commit()
		metrics.ObserveTxn("submit", began)
		var existing []int // indexes in valid of the tasks whose id exists
		var stored []*clientv3.TxnResponse
		if err == nil {
			for k, r := range resp.Responses[:len(sent)] { // the level markers follow
				if !r.GetResponseTxn().Succeeded {
					existing = append(existing, sent[k])
				}
			}
			// Tell duplicates from conflicts by what is stored: one read,
			// made only when some id existed.
			if len(existing) > 0 {
				gets := make([]clientv3.Op, len(existing))
				for k, i := range existing {
					gets[k] = clientv3.OpGet(c.keys.TaskRecord(valid[i].ID))
				}
				var rr *clientv3.TxnResponse
				if rr, err = c.cli.Txn(ctx).Then(gets...).Commit(); err == nil {
					stored = append(stored, rr)
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = true
			if resp != nil { // the tasks went in; only telling duplicates from conflicts failed
				res.Submitted += len(sent) - len(existing)
				depth.added(len(sent) - len(existing))
			}
			return fmt.Errorf("queue: submit to %s: %w", q, err)
		}
		res.Submitted += len(sent) - len(existing)
		depth.added(len(sent) - len(existing))
		for k, i := range existing {
			// A resubmission of the same task is a duplicate, anything
			// else a conflict.
			if err := sameSubmission(stored[0].Responses[k].GetResponseRange().Kvs, &valid[i], subs[i].dated); err != nil {
				res.Rejected = append(res.Rejected, LineError{Line: subs[i].line, Error: err.Error()})
				continue
			}
			res.Duplicates++
		}
		done += len(sent)
		if progress != nil {
			progress(done)
		}
		return nil
	}
	flush := func() (err error) {
		if len(ops) == 0 {
			return nil
		}
		mu.Lock()
		stop := failed
		mu.Unlock()
		if stop {
			return g.Wait() // a request failed: send no more
		}
		mu.Lock()
		room, err := depth.room(ctx, len(ops))
		mu.Unlock()
		if err != nil {
			return err
		}
		full := room < len(ops)
		if full {
			mu.Lock()
			done += len(ops) - room
			mu.Unlock()
			ops, idx = ops[:room], idx[:room]
		}
		defer func() {
			if full && err == nil {
				err = depth.fullError()
			}
		}()
		if len(ops) == 0 {
			return depth.fullError()
		}
		// The priority levels' markers go in the same transaction as
		// the tasks, after them: a claimer that finds a level empty can
		// only remove its marker if no task was added since.
		batch := append(append(make([]clientv3.Op, 0, len(ops)+len(markers)+1), ops...), markers...)
		if !named { // the first request enters the queue in the directory
			batch, named = append(batch, c.nameOp(q)), true
		}
		sent := slices.Clone(idx)
		g.Go(func() error { return send(batch, sent) })
		if full || inFlight == 1 {
			// A full queue ends the submission, and a bounded one counts
			// each request before the next: wait for this one.
			if err := g.Wait(); err != nil {
				return err
			}
		}
		ops, idx, size, markers = ops[:0], idx[:0], 0, nil
		clear(levels)
		return nil
	}
	// fail waits for the requests in flight, so the counts are final, and
	// says how far the submission got, and whether submitting the same
	// tasks again is safe: it is when every task came with its id.
	fail := func(err error) (SubmitResult, error) {
		_ = g.Wait()
		SortLineErrors(res.Rejected)
		if qf := (*QueueFullError)(nil); errors.As(err, &qf) {
			return res, err // it carries its own counts
		}
		if generated {
			return res, fmt.Errorf("%w (%d of %d submitted; tasks without a task_id were given one here, so submitting them again would add them twice)", err, res.Submitted, len(valid))
		}
		return res, fmt.Errorf("%w (%d of %d submitted; submitting again is safe: tasks already in count as duplicates)", err, res.Submitted, len(valid))
	}
	for i := range valid {
		t := &valid[i]
		if first, ok := seen[t.ID]; ok { // etcd refuses a request that writes one key twice
			err := sameTask(&valid[first], t, subs[i].dated)
			mu.Lock()
			if err != nil {
				res.Rejected = append(res.Rejected, LineError{Line: subs[i].line,
					Error: fmt.Sprintf("task_id %s is also on line %d, with different content; give each task its own task_id", t.ID, subs[first].line)})
			} else {
				res.Duplicates++
			}
			done++
			mu.Unlock()
			continue
		}
		seen[t.ID] = i
		rec, err := json.Marshal(t)
		if err != nil {
			_ = g.Wait()
			return res, fmt.Errorf("queue: encode task %s (%d of %d submitted before it): %w", t.ID, res.Submitted, len(valid), err)
		}
		if len(ops) == SubmitBatch || size+len(rec) > maxRequestBytes {
			if err := flush(); err != nil {
				return fail(err)
			}
		}
		if lv := levelOf(t.Metadata.Priority); !levels[lv] {
			levels[lv] = true
			markers = append(markers, clientv3.OpPut(c.levelKey(q, lv), ""))
		}
		recKey := c.keys.TaskRecord(t.ID)
		ops = append(ops, clientv3.OpTxn(
			[]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(recKey), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(recKey, string(rec)), clientv3.OpPut(c.pendingKey(t), encodePending(0, false))},
			nil))
		idx = append(idx, i)
		size += len(rec) + 200
	}
	if err := flush(); err != nil {
		return fail(err)
	}
	if err := g.Wait(); err != nil {
		return fail(err)
	}
	SortLineErrors(res.Rejected)
	return res, nil
}

// ErrQueueFull is matched by the error of a submission to a queue at its
// maximum depth.
var ErrQueueFull = errors.New("queue: full")

// QueueFullError says how full the queue is.
type QueueFullError struct {
	Queue      string
	Depth, Max int64
	// Submitted counts the tasks this submission added before the queue
	// filled.
	Submitted int
}

// Error implements error.
func (e *QueueFullError) Error() string {
	return fmt.Sprintf("queue %s is full: %d unfinished tasks, at most %d (%d submitted before it filled); retry later, or raise the limit with `drover queues set %s --max-depth N`",
		e.Queue, e.Depth, e.Max, e.Submitted, e.Queue)
}

// Unwrap returns ErrQueueFull.
func (e *QueueFullError) Unwrap() error { return ErrQueueFull }

// depth keeps a submission within its queue's maximum depth. It counts the
// queue's unfinished tasks at the start and again every few transactions or
// when near the bound (counting walks the queue's keys in etcd), and adds
// its own submissions in between. Concurrent submitters can overshoot the
// bound by at most one transaction each.
type depth struct {
	c         *Client
	q         string
	max       int64
	count     int64
	sinceRead int
	submitted int
	fifo      bool
}

func (c *Client) depthGuard(ctx context.Context, q string) (*depth, error) {
	cfg, err := c.GetConfig(ctx, q)
	if err != nil {
		return nil, err
	}
	return &depth{c: c, q: q, max: cfg.MaxDepth, count: -1, fifo: cfg.FIFO}, nil
}

// room returns how many of n tasks fit under the maximum depth.
func (d *depth) room(ctx context.Context, n int) (int, error) {
	if d.max == 0 {
		return n, nil
	}
	if d.count < 0 || d.sinceRead >= 10 || d.count+int64(n) > d.max*9/10 {
		st, err := d.c.Stats(ctx, d.q)
		if err != nil {
			return 0, err
		}
		d.count, d.sinceRead = st.Unfinished(), 0
	}
	d.sinceRead++
	return int(max(0, min(int64(n), d.max-d.count))), nil
}

func (d *depth) fullError() error {
	return &QueueFullError{Queue: d.q, Depth: d.count, Max: d.max, Submitted: d.submitted}
}

func (d *depth) added(n int) {
	d.count += int64(n)
	d.submitted += n
}
