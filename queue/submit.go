package queue

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/tracing/otelspan"
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

// Submit adds tasks to queue q. Tasks go in segments: one key holds up to
// SegmentSize tasks of one priority level, written in one transaction with
// an index key per task that makes task_id idempotent. A task whose id
// exists already is counted as a duplicate and left as it is, so submitting
// the same batch twice creates nothing new. Invalid tasks are listed in
// Rejected and the valid ones still go in. Up to 16 transactions are in
// flight at once, except for a queue with a maximum depth or in FIFO order,
// which takes one at a time. progress, if set, is called after each
// transaction with the number of tasks handled so far: from another
// goroutine, one call at a time, with growing numbers; it should return
// quickly.
//
// Each task stores the context of the submission's span (kind producer,
// named "send <queue>") as its TraceParent, unless it gives its own; the
// span is a child of ctx's and comes from the client's TracerProvider.
func (c *Client) Submit(ctx context.Context, q string, tasks []Task, progress func(done int)) (SubmitResult, error) {
	ctx, span := otelspan.StartSend(ctx, c.tracer, c.keys.Namespace(), q, len(tasks))
	res, err := c.submit(ctx, q, tasks, progress)
	otelspan.EndSend(span, res.Submitted, res.Duplicates, len(res.Rejected), err)
	return res, err
}

func (c *Client) submit(ctx context.Context, q string, tasks []Task, progress func(done int)) (SubmitResult, error) {
	res := SubmitResult{Rejected: []LineError{}}
	if err := CheckQueue(q); err != nil {
		return res, err
	}
	valid, subs, generated := c.validate(q, tasks, &res)
	if tp := otelspan.TraceParent(ctx); tp != "" {
		for i := range valid {
			if valid[i].TraceParent == "" {
				valid[i].TraceParent = tp
			}
		}
	}
	depth, err := c.depthGuard(ctx, q)
	if err != nil {
		return res, err
	}
	sb := &submission{c: c, ctx: ctx, q: q, valid: valid, subs: subs, res: res, progress: progress,
		done: len(tasks) - len(valid), depth: depth, inFlight: submitInFlight}
	// A queue without a maximum depth takes several requests in flight
	// (etcd commits them in one batch, where one at a time leaves it
	// waiting on the round trip); with a maximum depth each request waits
	// for the room its predecessor left, so they go one at a time.
	// A FIFO queue also takes one at a time: a claimer must never see a
	// later request's tasks before an earlier one's.
	if depth.max > 0 || depth.fifo {
		sb.inFlight = 1
	}
	// A failed request does not cancel the others in flight: what they
	// submitted is counted.
	sb.g.SetLimit(sb.inFlight)
	seen := make(map[string]int, len(valid)) // id → its first index in valid
	batches := map[int][]int{}               // level → indexes in valid
	sizes := map[int]int{}
	var levels []int // in the order they first came
	var later []int  // indexes in valid of the tasks that run later
	for i := range valid {
		t := &valid[i]
		if first, ok := seen[t.ID]; ok { // one id twice in one submission
			sb.repeated(first, i)
			continue
		}
		seen[t.ID] = i
		if !t.RunAt.IsZero() {
			later = append(later, i)
			continue
		}
		size := recordSize(t)
		lv := MaxPriority - t.Metadata.Priority
		if _, ok := batches[lv]; !ok {
			levels = append(levels, lv)
		}
		if len(batches[lv]) == SegmentSize || sizes[lv]+size > maxSegmentBytes {
			if err := sb.flush(batches[lv]); err != nil {
				return sb.fail(err, generated)
			}
			batches[lv], sizes[lv] = nil, 0
		}
		batches[lv] = append(batches[lv], i)
		sizes[lv] += size
	}
	for _, lv := range levels {
		if err := sb.flush(batches[lv]); err != nil {
			return sb.fail(err, generated)
		}
	}
	for _, idx := range dueGroups(valid, later) {
		if err := sb.flush(idx); err != nil {
			return sb.fail(err, generated)
		}
	}
	if err := sb.g.Wait(); err != nil {
		return sb.fail(err, generated)
	}
	SortLineErrors(sb.res.Rejected)
	return sb.res, nil
}

// DueGroup is how far apart the due times of tasks submitted together
// may be for them to share a segment: the segment falls due at the latest
// of them, so a task may be claimed up to DueGroup after its time, never
// before it.
const DueGroup = 20 * time.Millisecond

// dueGroups splits the tasks valid[later], which run later, into
// segments: by priority level, then due time, each of up to SegmentSize
// tasks due within DueGroup of its first.
func dueGroups(valid []Task, later []int) [][]int {
	slices.SortStableFunc(later, func(a, b int) int {
		if pa, pb := valid[a].Metadata.Priority, valid[b].Metadata.Priority; pa != pb {
			return pb - pa
		}
		return valid[a].RunAt.Compare(valid[b].RunAt)
	})
	var out [][]int
	var cur []int
	size := 0
	for _, i := range later {
		t := &valid[i]
		if len(cur) > 0 {
			first := &valid[cur[0]]
			if len(cur) == SegmentSize || size+recordSize(t) > maxSegmentBytes ||
				first.Metadata.Priority != t.Metadata.Priority || t.RunAt.Sub(first.RunAt) > DueGroup {
				out, cur, size = append(out, cur), nil, 0
			}
		}
		cur = append(cur, i)
		size += recordSize(t)
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// submission is one call of Submit: its segments in flight and its counts.
type submission struct {
	c        *Client
	ctx      context.Context
	q        string
	valid    []Task
	subs     []submitted
	progress func(done int)
	inFlight int
	g        errgroup.Group

	mu     sync.Mutex // guards what follows, and progress calls
	res    SubmitResult
	done   int
	depth  *depth
	failed bool
	named  bool // the queue was entered in the directory
}

// repeated counts valid[i], whose id valid[first] has too: a duplicate when
// the same, else a rejected line.
func (sb *submission) repeated(first, i int) {
	err := sameTask(&sb.valid[first], &sb.valid[i], sb.subs[i].dated)
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err != nil {
		sb.res.Rejected = append(sb.res.Rejected, LineError{Line: sb.subs[i].line,
			Error: fmt.Sprintf("task_id %s is also on line %d, with different content; give each task its own task_id", sb.valid[i].ID, sb.subs[first].line)})
	} else {
		sb.res.Duplicates++
	}
	sb.done++
}

// flush sends the tasks valid[idx] as one segment, within the queue's
// maximum depth.
func (sb *submission) flush(idx []int) (err error) {
	if len(idx) == 0 {
		return nil
	}
	sb.mu.Lock()
	stop := sb.failed
	room, err := sb.depth.room(sb.ctx, len(idx))
	full := room < len(idx)
	if full && err == nil {
		sb.done += len(idx) - room
	}
	first := !sb.named // the first request enters the queue in the directory
	sb.named = true
	sb.mu.Unlock()
	if stop {
		return sb.g.Wait() // a request failed: send no more
	}
	if err != nil {
		return err
	}
	idx = idx[:room]
	defer func() {
		if full && err == nil {
			err = sb.depth.fullError()
		}
	}()
	if len(idx) == 0 {
		return sb.depth.fullError()
	}
	sb.g.Go(func() error { return sb.send(idx, first) })
	if full || sb.inFlight == 1 {
		// A full queue ends the submission, and a bounded one counts
		// each request before the next: wait for this one.
		return sb.g.Wait()
	}
	return nil
}

// send writes one segment and counts what it did.
func (sb *submission) send(idx []int, first bool) error {
	existing, err := sb.c.putSegment(sb.ctx, sb.q, sb.valid, idx, first)
	var stored map[string]*Task
	if err == nil && len(existing) > 0 {
		// Tell duplicates from conflicts by what is stored: one read,
		// made only when some id existed.
		stored, err = sb.c.storedTasks(sb.ctx, sb.valid, existing)
	}
	sb.mu.Lock()
	defer sb.mu.Unlock()
	if err != nil {
		sb.failed = true
		return fmt.Errorf("queue: submit to %s: %w", sb.q, err)
	}
	sb.res.Submitted += len(idx) - len(existing)
	sb.depth.added(len(idx) - len(existing))
	for _, i := range existing {
		// A resubmission of the same task is a duplicate, anything else
		// a conflict.
		if err := sameStored(stored[sb.valid[i].ID], &sb.valid[i], sb.subs[i].dated); err != nil {
			sb.res.Rejected = append(sb.res.Rejected, LineError{Line: sb.subs[i].line, Error: err.Error()})
			continue
		}
		sb.res.Duplicates++
	}
	sb.done += len(idx)
	if sb.progress != nil {
		sb.progress(sb.done)
	}
	return nil
}

// fail waits for the requests in flight, so the counts are final, and says
// how far the submission got, and whether submitting the same tasks again
// is safe: it is when every task came with its id (generated false).
func (sb *submission) fail(err error, generated bool) (SubmitResult, error) {
	_ = sb.g.Wait()
	SortLineErrors(sb.res.Rejected)
	if qf := (*QueueFullError)(nil); errors.As(err, &qf) {
		return sb.res, err // it carries its own counts
	}
	if generated {
		return sb.res, fmt.Errorf("%w (%d of %d submitted; tasks without a task_id were given one here, so submitting them again would add them twice)", err, sb.res.Submitted, len(sb.valid))
	}
	return sb.res, fmt.Errorf("%w (%d of %d submitted; submitting again is safe: tasks already in count as duplicates)", err, sb.res.Submitted, len(sb.valid))
}

// validate checks tasks for queue q, gives those without an id one, and
// returns the valid ones with where each came from; rejected ones go into
// res. generated says some task was given its id here.
func (c *Client) validate(q string, tasks []Task, res *SubmitResult) (valid []Task, subs []submitted, generated bool) {
	now := c.now()
	valid = make([]Task, 0, len(tasks))
	subs = make([]submitted, 0, len(tasks)) // valid[i] is tasks[subs[i].line-1]
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
		t.CurrentStatus, t.Shard, t.Transitions, t.StreamSettled = "", nil, nil, false // drover's to set, not the submitter's
		valid = append(valid, t)
		subs = append(subs, submitted{line: i + 1, dated: datedBySubmitter})
	}
	return valid, subs, generated
}

// recordSize estimates a task's encoded size.
func recordSize(t *Task) int {
	return 256 + len(t.ID) + len(t.Type) + len(t.TraceParent) + len(t.InputDataURI) + len(t.OutputDataURI) + len(t.Parameters) +
		len(t.Metadata.SourceSystem) + len(t.Metadata.Tenant) + len(t.Metadata.Budget)
}

// putSegment writes the tasks valid[idx] as one new segment of queue q,
// with an index key per task, in one transaction that requires every index
// key to be absent. When some exist, it leaves those tasks out and writes
// the others; it returns the indexes (in valid) of those that existed.
// first adds the queue to the queue directory.
func (c *Client) putSegment(ctx context.Context, q string, valid []Task, idx []int, first bool) (existing []int, err error) {
	if cut := sealCut(valid, idx); cut > 0 { // children of many parents: a segment each part
		existing, err = c.putSegment(ctx, q, valid, idx[:cut], first)
		if err != nil {
			return existing, err
		}
		more, err := c.putSegment(ctx, q, valid, idx[cut:], false)
		return append(existing, more...), err
	}
	return c.putOneSegment(ctx, q, valid, idx, first)
}

// putOneSegment is putSegment of tasks whose parents' seals one
// transaction compares.
func (c *Client) putOneSegment(ctx context.Context, q string, valid []Task, idx []int, first bool) (existing []int, err error) {
	idx = slices.Clone(idx)
	for try := 0; len(idx) > 0; try++ {
		if try == 5 {
			return existing, errors.New("the segment kept being refused while nothing said why; submit again")
		}
		t0 := &valid[idx[0]]
		ts, due := segmentTasksOf(valid, idx)
		// A segment that runs later is named after its due time, which
		// says where its key in the due index is.
		named, suffix := c.now(), NewID()[:8]
		if !due.IsZero() {
			named, suffix = due, scheduledMark+suffix[1:]
		}
		seg := keyspace.SegmentName(MaxPriority-t0.Metadata.Priority, named, suffix)
		data, err := encodeSegment(ts)
		if err != nil {
			return existing, fmt.Errorf("encode segment: %w", err)
		}
		cmps := make([]clientv3.Cmp, 0, len(idx)+2)
		puts := make([]clientv3.Op, 0, len(idx)+3)
		gets := make([]clientv3.Op, 0, len(idx))
		for k, i := range idx {
			key := c.keys.TaskIndex(valid[i].ID)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			puts = append(puts, clientv3.OpPut(key, keyspace.TaskPlace{Queue: q, Segment: seg, Slot: k}.String()))
			gets = append(gets, clientv3.OpGet(key, clientv3.WithCountOnly()))
		}
		// The store guard: refused past the high-water mark, and the
		// guard key read back in the same request to say why.
		cmps = append(cmps, storeguard.NotFull(c.keys))
		gets = append(gets, storeguard.GetOp(c.keys))
		// Children only while their parents' children are not sealed
		// (cascadeMarkOp): a parent that ended meanwhile gets none.
		sealed := c.sealCompares(valid, idx, &cmps, &gets)
		// No record of that name (tasks due at one time share the time
		// in their names): a clash is refused and sent again, renamed.
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.keys.Segment(q, seg)), "=", 0))
		live := c.keys.SegmentOpen(q, seg)
		if !due.IsZero() {
			live = c.dueKey(q, seg, len(idx))
			puts = append(puts, clientv3.OpPut(c.keys.QueueDueVersion(q), ""))
		}
		puts = append(puts, clientv3.OpPut(c.keys.Segment(q, seg), string(data)), clientv3.OpPut(live, strconv.Itoa(len(idx))))
		if first {
			puts = append(puts, c.nameOp(q))
		}
		began := time.Now()
		resp, err := c.cli.Txn(ctx).If(cmps...).Then(puts...).Else(gets...).Commit()
		metrics.ObserveTxn("submit", began)
		if err != nil {
			return existing, err
		}
		if resp.Succeeded {
			return existing, nil
		}
		if err := storeguard.FromRange(resp.Responses[len(idx)].GetResponseRange()); err != nil {
			return existing, err
		}
		if err := sealedError(sealed, resp.Responses[len(idx)+1:]); err != nil {
			return existing, err
		}
		var left []int
		for k, r := range resp.Responses[:len(idx)] {
			if r.GetResponseRange().Count > 0 {
				existing = append(existing, idx[k])
			} else {
				left = append(left, idx[k])
			}
		}
		if len(left) == len(idx) { // refused, yet no index key and no guard key: they went since
			continue
		}
		idx = left
	}
	return existing, nil
}

// segmentTasksOf returns the tasks valid[idx] as a segment stores them,
// and the latest due time of those that run later (zero: none does).
func segmentTasksOf(valid []Task, idx []int) ([]Task, time.Time) {
	var due time.Time
	ts := make([]Task, len(idx))
	for k, i := range idx {
		ts[k] = valid[i]
		if ts[k].RunAt.After(due) {
			due = ts[k].RunAt
		}
		ts[k].Queue, ts[k].RunAt = "", time.Time{}
	}
	return ts, due
}

// storedTasks reads the stored tasks of valid[existing] by id.
func (c *Client) storedTasks(ctx context.Context, valid []Task, existing []int) (map[string]*Task, error) {
	ids := make([]string, len(existing))
	for k, i := range existing {
		ids[k] = valid[i].ID
	}
	ts, err := c.getMany(ctx, ids)
	if err != nil {
		return nil, err
	}
	out := make(map[string]*Task, len(ts))
	for _, t := range ts {
		out[t.ID] = t
	}
	return out, nil
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

// submitted is where a valid task of a submission came from: its 1-based
// position, and whether the submitter gave its created_at.
type submitted struct {
	line  int
	dated bool
}

// sameStored returns nil when stored (the task read back when a task's id
// already existed; nil when it was gone by then) is the same task as t,
// which makes t a duplicate; otherwise an error that names where the id is
// taken. A task id is unique across queues, for as long as its task is
// kept.
func sameStored(stored *Task, t *Task, dated bool) error {
	if stored == nil {
		// The task went between the failed compare and the read: it
		// was removed after its retention, in the same instant.
		return fmt.Errorf("task_id %s was taken a moment ago and has just been removed; submit it again", t.ID)
	}
	return sameTask(stored, t, dated)
}

// sameTask compares what a submitter gives of a task: queue, type, data
// URIs, parameters (as JSON values, so key order and spacing do not
// matter), metadata, retry budget, timeout, backoff and parent (a task of
// a child's id submitted apart is not that child). created_at counts
// only when the later submission gave it (otherwise it is the time of
// submission, which differs on every try).
func sameTask(old, t *Task, dated bool) error {
	if old.Queue != t.Queue {
		return fmt.Errorf("task_id %s already exists in queue %s; task ids are unique across queues: choose another task_id", t.ID, old.Queue)
	}
	same := old.Type == t.Type && old.InputDataURI == t.InputDataURI && old.OutputDataURI == t.OutputDataURI &&
		sameJSON(old.Parameters, t.Parameters) &&
		old.Metadata.Priority == t.Metadata.Priority && old.Metadata.SourceSystem == t.Metadata.SourceSystem &&
		old.Metadata.Tenant == t.Metadata.Tenant && old.Metadata.Budget == t.Metadata.Budget && old.Metadata.EstimatedTokens == t.Metadata.EstimatedTokens && (!dated || old.Metadata.CreatedAt.Equal(t.Metadata.CreatedAt)) &&
		old.Retries() == t.Retries() && old.Timeout == t.Timeout && old.BackoffBase == t.BackoffBase && old.BackoffMax == t.BackoffMax &&
		old.Parent == t.Parent && old.ParentStep == t.ParentStep && old.ParentQueue == t.ParentQueue
	if !same {
		return fmt.Errorf("task_id %s already exists in queue %s with different content; choose another task_id, or submit the same content to have it counted as a duplicate", t.ID, old.Queue)
	}
	return nil
}

// sameJSON reports whether a and b hold the same JSON value (absent and
// null are the same).
func sameJSON(a, b json.RawMessage) bool {
	a, b = bytes.TrimSpace(a), bytes.TrimSpace(b)
	if bytes.Equal(a, b) {
		return true
	}
	var va, vb any
	if len(a) > 0 && json.Unmarshal(a, &va) != nil || len(b) > 0 && json.Unmarshal(b, &vb) != nil {
		return false
	}
	return reflect.DeepEqual(va, vb)
}

// SortLineErrors orders rejected lines by line number.
func SortLineErrors(r []LineError) {
	sort.Slice(r, func(i, j int) bool { return r[i].Line < r[j].Line })
}
