package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// maxRequestBytes keeps every request well under etcd's 1.5 MiB limit.
const maxRequestBytes = 1 << 20

// SubmitBatch is how many tasks go into one etcd transaction (fewer when
// they are large: a request stays under 1 MiB): each takes a
// nested transaction of two puts, and etcd allows 128 operations a request by
// default.
const SubmitBatch = 60

// submitInFlight is how many submit requests may be in flight at once for a
// queue without a maximum depth.
const submitInFlight = 4

// Sentinel errors.
var (
	// ErrNotFound: no task has that id.
	ErrNotFound = errors.New("queue: task not found")
	// ErrFinished: the task is already in a terminal state.
	ErrFinished = errors.New("queue: task already finished")
	// ErrNotDead: the task is not in the dead-letter queue.
	ErrNotDead = errors.New("queue: task is not in the dead-letter queue")
)

// Client submits and inspects tasks. It is safe for concurrent use.
type Client struct {
	cli  *clientv3.Client
	keys keyspace.Space
	now  func() time.Time
}

// NewClient returns a client of namespace ns ("" means "drover").
func NewClient(cli *clientv3.Client, ns string) (*Client, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	return &Client{cli: cli, keys: keys, now: time.Now}, nil
}

// Shards is how many parts the pending index of a queue is split into, by a
// hash of the task id. etcd counts every key of a range it reads, even with
// a limit, so a claim reads one shard (a five-hundred-and-twelfth of the
// queue), never the whole queue. Within a shard, tasks are ordered by
// priority, then submission time; priority levels have markers so that a
// claim reads the highest level first (see docs/flow.md); among equal
// priorities the order across shards is approximate.
const Shards = 512

func shardOf(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % Shards)
}

// shardPrefix is the prefix of shard i of queue q's pending index.
func (c *Client) shardPrefix(q string, i int) string {
	return fmt.Sprintf("%s%03d/", c.keys.QueuePending(q), i)
}

// pendingKey is the task's key in the pending index: its shard, then higher
// priority first, then submission order.
func (c *Client) pendingKey(t *Task) string {
	shard := shardOf(t.ID)
	if t.Shard != nil {
		shard = *t.Shard
	}
	return fmt.Sprintf("%s%04d%019d-%s", c.shardPrefix(t.Queue, shard), MaxPriority-t.Metadata.Priority, t.Metadata.CreatedAt.UnixNano(), t.ID)
}

// levelOf is the priority level part of a task's pending key: higher
// priorities sort first.
func levelOf(priority int) string { return fmt.Sprintf("%04d", MaxPriority-priority) }

// levelKey is the marker of priority level lv in queue q.
func (c *Client) levelKey(q, lv string) string { return c.keys.QueueLevels(q) + lv }

// levelOfPending returns the priority level of a pending key.
func (c *Client) levelOfPending(q, key string) string {
	rest := strings.TrimPrefix(key, c.keys.QueuePending(q))
	if len(rest) < 8 { // "{shard:03d}/{level:04d}"
		return ""
	}
	return rest[4:8]
}

// pendingID returns the task id of a pending key, given the pending prefix.
func pendingID(key, prefix string) string {
	rest := strings.TrimPrefix(key, prefix)
	if _, after, ok := strings.Cut(rest, "/"); ok {
		rest = after
	}
	_, id, _ := strings.Cut(rest, "-")
	return id
}

// pendingValue is what a pending key holds: how many attempts were started,
// and whether the last write was a claim (then the claim key says whether it
// still holds).
type pendingValue struct {
	Attempts int  `json:"a"`
	Claimed  bool `json:"c,omitempty"`
}

func encodePending(attempts int, claimed bool) string {
	b, _ := json.Marshal(pendingValue{Attempts: attempts, Claimed: claimed})
	return string(b)
}

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
	for i := range tasks {
		t := tasks[i]
		t.Queue = q
		if t.ID == "" {
			t.ID = NewID()
			generated = true
		}
		if err := t.check(now); err != nil {
			res.Rejected = append(res.Rejected, LineError{Line: i + 1, Error: err.Error()})
			continue
		}
		t.CurrentStatus = Pending
		t.Transitions = []Transition{{Status: Pending, At: now.UTC()}}
		valid = append(valid, t)
	}
	done := len(tasks) - len(valid)
	seen := make(map[string]bool, len(valid))
	var ops, markers []clientv3.Op
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
	send := func(batch []clientv3.Op, tasks int) error {
		began := time.Now()
		resp, err := c.cli.Txn(ctx).Then(batch...).Commit()
		metrics.ObserveTxn("submit", began)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed = true
			return fmt.Errorf("queue: submit to %s: %w", q, err)
		}
		for _, r := range resp.Responses[:tasks] { // the level markers follow
			if r.GetResponseTxn().Succeeded {
				res.Submitted++
				depth.added(1)
			} else {
				res.Duplicates++
			}
		}
		done += tasks
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
			ops = ops[:room]
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
		batch := append(append(make([]clientv3.Op, 0, len(ops)+len(markers)), ops...), markers...)
		tasks := len(ops)
		g.Go(func() error { return send(batch, tasks) })
		if full || inFlight == 1 {
			// A full queue ends the submission, and a bounded one counts
			// each request before the next: wait for this one.
			if err := g.Wait(); err != nil {
				return err
			}
		}
		ops, size, markers = ops[:0], 0, nil
		clear(levels)
		return nil
	}
	// fail waits for the requests in flight, so the counts are final, and
	// says how far the submission got, and whether submitting the same
	// tasks again is safe: it is when every task came with its id.
	fail := func(err error) (SubmitResult, error) {
		_ = g.Wait()
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
		if seen[t.ID] { // etcd refuses a request that writes one key twice
			mu.Lock()
			res.Duplicates++
			done++
			mu.Unlock()
			continue
		}
		seen[t.ID] = true
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
		size += len(rec) + 200
	}
	if err := flush(); err != nil {
		return fail(err)
	}
	if err := g.Wait(); err != nil {
		return fail(err)
	}
	return res, nil
}

// Get returns task id with its current status.
func (c *Client) Get(ctx context.Context, id string) (*Task, error) {
	if err := keyspace.CheckName("task id", id); err != nil {
		return nil, err
	}
	ts, err := c.getMany(ctx, []string{id})
	if err != nil {
		return nil, err
	}
	if len(ts) == 0 {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return ts[0], nil
}

// getMany reads the records of ids (skipping missing ones) and resolves each
// one's status from the index keys, in two read transactions.
func (c *Client) getMany(ctx context.Context, ids []string) ([]*Task, error) {
	var out []*Task
	for start := 0; start < len(ids); start += 100 {
		chunk := ids[start:min(start+100, len(ids))]
		ops := make([]clientv3.Op, len(chunk))
		for i, id := range chunk {
			ops[i] = clientv3.OpGet(c.keys.TaskRecord(id))
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("queue: read tasks: %w", err)
		}
		var tasks []*Task
		for _, r := range resp.Responses {
			kvs := r.GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue
			}
			t := new(Task)
			if err := json.Unmarshal(kvs[0].Value, t); err != nil {
				return nil, fmt.Errorf("queue: task record %s is unreadable: %w", kvs[0].Key, err)
			}
			t.rev = kvs[0].ModRevision
			tasks = append(tasks, t)
		}
		if err := c.resolve(ctx, tasks); err != nil {
			return nil, err
		}
		out = append(out, tasks...)
	}
	return out, nil
}

// resolve sets each task's CurrentStatus from where its keys are: a claim
// means RUNNING; otherwise a terminal status in the record stands; otherwise
// a retry key means RETRYING and a pending key PENDING.
func (c *Client) resolve(ctx context.Context, tasks []*Task) error {
	if len(tasks) == 0 {
		return nil
	}
	ops := make([]clientv3.Op, 0, 3*len(tasks))
	for _, t := range tasks {
		ops = append(ops,
			clientv3.OpGet(c.keys.QueueClaim(t.Queue, t.ID)),
			clientv3.OpGet(c.pendingKey(t), clientv3.WithKeysOnly()),
			clientv3.OpGet(c.retryKey(t), clientv3.WithCountOnly()))
	}
	resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return fmt.Errorf("queue: read task states: %w", err)
	}
	for i, t := range tasks {
		claim := resp.Responses[3*i].GetResponseRange().Kvs
		pend := resp.Responses[3*i+1].GetResponseRange().Kvs
		pending := len(pend) > 0
		t.pendingRev = 0
		if pending {
			t.pendingRev = pend[0].ModRevision
		}
		retry := resp.Responses[3*i+2].GetResponseRange().Count > 0
		switch {
		case len(claim) > 0:
			var cv claimValue
			_ = json.Unmarshal(claim[0].Value, &cv)
			t.CurrentStatus, t.Attempt, t.Token = Running, cv.Attempt, claim[0].CreateRevision
		case t.CurrentStatus == Succeeded || t.CurrentStatus == Dead || t.CurrentStatus == Cancelled:
		case retry:
			t.CurrentStatus = Retrying
		case pending:
			t.CurrentStatus = Pending
		}
	}
	return nil
}

// retryKey is the task's key in the retry schedule.
func (c *Client) retryKey(t *Task) string {
	return fmt.Sprintf("%s%019d-%s", c.keys.QueueRetry(t.Queue), t.ScheduledAt.UnixNano(), t.ID)
}

// List returns up to limit tasks of queue q in status st (0 means 100).
func (c *Client) List(ctx context.Context, q string, st Status, limit int) ([]*Task, error) {
	if err := CheckQueue(q); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = 100
	}
	var prefix string
	switch st {
	case Pending:
		prefix = c.keys.QueuePending(q)
	case Running:
		prefix = c.keys.QueueClaims(q)
	case Retrying:
		prefix = c.keys.QueueRetry(q)
	case Dead:
		prefix = c.keys.QueueDead(q)
	case Succeeded, Cancelled:
		prefix = c.keys.QueueDone(q, string(st)) // "{finished}-{id}"
	default:
		return nil, &drover.InputError{Field: "status", Value: string(st), Rule: "must be PENDING, RUNNING, RETRYING, SUCCEEDED, DEAD or CANCELLED"}
	}
	var ids []string
	claimed := map[string]bool{}
	if st == Pending {
		g, err := c.cli.Get(ctx, c.keys.QueueClaims(q), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("queue: list %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			claimed[strings.TrimPrefix(string(kv.Key), c.keys.QueueClaims(q))] = true
		}
	}
	g, err := c.cli.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(int64(limit+len(claimed))))
	if err != nil {
		return nil, fmt.Errorf("queue: list %s: %w", q, err)
	}
	for _, kv := range g.Kvs {
		id := strings.TrimPrefix(string(kv.Key), prefix)
		switch st {
		case Pending:
			id = pendingID(string(kv.Key), prefix)
		case Retrying, Succeeded, Cancelled: // "{time}-{id}"
			_, id, _ = strings.Cut(id, "-")
		}
		if claimed[id] {
			continue
		}
		if ids = append(ids, id); len(ids) == limit {
			break
		}
	}
	return c.getMany(ctx, ids)
}

// Stats counts queue q's tasks by status.
type Stats struct {
	Pending   int64 `json:"pending"`
	Running   int64 `json:"running"`
	Retrying  int64 `json:"retrying"`
	Succeeded int64 `json:"succeeded"`
	Dead      int64 `json:"dead"`
	Cancelled int64 `json:"cancelled"`
}

// Total is the sum of every count.
func (s Stats) Total() int64 {
	return s.Pending + s.Running + s.Retrying + s.Succeeded + s.Dead + s.Cancelled
}

// Unfinished counts tasks that are pending, running or retrying.
func (s Stats) Unfinished() int64 { return s.Pending + s.Running + s.Retrying }

// Stats counts queue q's tasks by status, in one read transaction.
func (c *Client) Stats(ctx context.Context, q string) (Stats, error) {
	if err := CheckQueue(q); err != nil {
		return Stats{}, err
	}
	count := func(p string) clientv3.Op { return clientv3.OpGet(p, clientv3.WithPrefix(), clientv3.WithCountOnly()) }
	resp, err := c.cli.Txn(ctx).Then(
		count(c.keys.QueuePending(q)), count(c.keys.QueueClaims(q)), count(c.keys.QueueRetry(q)),
		count(c.keys.QueueDone(q, string(Succeeded))), count(c.keys.QueueDead(q)), count(c.keys.QueueDone(q, string(Cancelled))),
		clientv3.OpGet(c.keys.QueueArchived(q)),
	).Commit()
	if err != nil {
		return Stats{}, fmt.Errorf("queue: stats of %s: %w", q, err)
	}
	n := func(i int) int64 { return resp.Responses[i].GetResponseRange().Count }
	var arch archived
	if kvs := resp.Responses[6].GetResponseRange().Kvs; len(kvs) > 0 {
		_ = json.Unmarshal(kvs[0].Value, &arch)
	}
	return Stats{Pending: n(0) - n(1), Running: n(1), Retrying: n(2), Succeeded: n(3) + arch.Succeeded, Dead: n(4), Cancelled: n(5) + arch.Cancelled}, nil
}

// archived counts finished tasks removed after their retention period, so
// that Stats still counts them.
type archived struct {
	Succeeded int64 `json:"succeeded"`
	Cancelled int64 `json:"cancelled"`
}

// doneKey is a finished task's key in the done index: by finishing time, so
// that the oldest are removed first.
func (c *Client) doneKey(q string, st Status, at time.Time, id string) string {
	return fmt.Sprintf("%s%019d-%s", c.keys.QueueDone(q, string(st)), at.UnixNano(), id)
}

// DefaultRetention is how long finished tasks are kept by default.
const DefaultRetention = 24 * time.Hour

// sweepBatch is how many finished tasks one removal transaction takes: two
// deletes each, within etcd's 128 operations a request.
const sweepBatch = 60

// RemoveExpired removes queue q's tasks that SUCCEEDED or were CANCELLED
// more than retention ago: their records and done keys go, and the queue's
// archived counts grow by as many, in the same transaction, so Stats does
// not change. Several callers may run it at once; each removal is counted
// once. It returns how many tasks it removed.
func (c *Client) RemoveExpired(ctx context.Context, q string, retention time.Duration) (int, error) {
	if err := CheckQueue(q); err != nil {
		return 0, err
	}
	removed := 0
	cutoff := c.now().Add(-retention).UnixNano()
	for _, st := range []Status{Succeeded, Cancelled} {
		pre := c.keys.QueueDone(q, string(st))
		for {
			g, err := c.cli.Txn(ctx).Then(
				clientv3.OpGet(pre, clientv3.WithRange(fmt.Sprintf("%s%019d", pre, cutoff)), clientv3.WithLimit(sweepBatch), clientv3.WithKeysOnly()),
				clientv3.OpGet(c.keys.QueueArchived(q)),
			).Commit()
			if err != nil {
				return removed, fmt.Errorf("queue: remove expired tasks of %s: %w", q, err)
			}
			kvs := g.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 {
				break
			}
			var arch archived
			var archRev int64
			if a := g.Responses[1].GetResponseRange().Kvs; len(a) > 0 {
				_ = json.Unmarshal(a[0].Value, &arch)
				archRev = a[0].ModRevision
			}
			ops := make([]clientv3.Op, 0, 2*len(kvs)+1)
			cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(c.keys.QueueArchived(q)), "=", archRev)}
			for _, kv := range kvs {
				_, id, _ := strings.Cut(strings.TrimPrefix(string(kv.Key), pre), "-")
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
				// The record, and a step-wise task's checkpoint and steps.
				ops = append(ops, clientv3.OpDelete(string(kv.Key)), clientv3.OpDelete(c.keys.Task(id), clientv3.WithPrefix()))
			}
			if st == Succeeded {
				arch.Succeeded += int64(len(kvs))
			} else {
				arch.Cancelled += int64(len(kvs))
			}
			b, _ := json.Marshal(arch)
			ops = append(ops, clientv3.OpPut(c.keys.QueueArchived(q), string(b)))
			resp, err := c.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
			if err != nil {
				return removed, fmt.Errorf("queue: remove expired tasks of %s: %w", q, err)
			}
			if resp.Succeeded {
				removed += len(kvs)
			}
		}
	}
	return removed, nil
}

// cancelSignalTTL is how long a cancel request stays for the worker to see.
const cancelSignalTTL = 60

// Cancel cancels task id: it leaves every index, its record says CANCELLED,
// and a worker running it has its claim taken away (its writes are fenced
// out) and its context cancelled.
func (c *Client) Cancel(ctx context.Context, id string) (*Task, error) {
	for attempt := 0; attempt < 5; attempt++ {
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		switch t.CurrentStatus {
		case Succeeded, Dead, Cancelled:
			return t, fmt.Errorf("%w: task %s is %s", ErrFinished, id, t.CurrentStatus)
		}
		recKey := c.keys.TaskRecord(id)
		now := c.now().UTC()
		t.CurrentStatus = Cancelled
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Cancelled, At: now, Attempt: t.Attempt})
		rec, _ := json.Marshal(t)
		ops := []clientv3.Op{
			clientv3.OpPut(recKey, string(rec)),
			clientv3.OpDelete(c.pendingKey(t)),
			clientv3.OpDelete(c.retryKey(t)),
			clientv3.OpDelete(c.keys.QueueClaim(t.Queue, id)),
			clientv3.OpPut(c.doneKey(t.Queue, Cancelled, now, id), ""),
		}
		if t.Token != 0 {
			l, err := c.cli.Grant(ctx, cancelSignalTTL)
			if err != nil {
				return nil, fmt.Errorf("queue: cancel %s: %w", id, err)
			}
			ops = append(ops, clientv3.OpPut(c.keys.QueueCancel(t.Queue)+id, "", clientv3.WithLease(l.ID)))
		}
		// Nothing may have changed since the read that decided all this:
		// not the record (an outcome rewrites it), not the pending key (a
		// claim rewrites it, and would then need the cancel signal).
		resp, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.ModRevision(recKey), "=", t.rev),
			clientv3.Compare(clientv3.ModRevision(c.pendingKey(t)), "=", t.pendingRev),
		).Then(ops...).Commit()
		if err != nil {
			return nil, fmt.Errorf("queue: cancel %s: %w", id, err)
		}
		if resp.Succeeded {
			return t, nil
		}
	}
	return nil, fmt.Errorf("queue: cancel %s: the task kept changing; try again", id)
}

func appendTransition(ts []Transition, tr Transition) []Transition {
	ts = append(ts, tr)
	if len(ts) > MaxHistory {
		ts = append(ts[:1], ts[len(ts)-MaxHistory+1:]...)
	}
	return ts
}

// Requeue moves dead tasks of queue q back to pending with a fresh retry
// budget; ids empty means every dead task. It returns how many moved.
func (c *Client) Requeue(ctx context.Context, q string, ids []string) (int, error) {
	return c.eachDead(ctx, q, ids, func(t *Task, deadKey string) []clientv3.Op {
		now := c.now().UTC()
		t.CurrentStatus, t.RetriesAttempted, t.Attempt, t.Token = Pending, 0, 0, 0
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Pending, At: now, Error: "requeued from the dead-letter queue"})
		rec, _ := json.Marshal(t)
		return []clientv3.Op{clientv3.OpDelete(deadKey), clientv3.OpPut(c.keys.TaskRecord(t.ID), string(rec)), clientv3.OpPut(c.pendingKey(t), encodePending(0, false)),
			clientv3.OpPut(c.levelKey(q, levelOf(t.Metadata.Priority)), "")}
	})
}

// Purge deletes dead tasks of queue q for good; ids empty means all of them.
func (c *Client) Purge(ctx context.Context, q string, ids []string) (int, error) {
	return c.eachDead(ctx, q, ids, func(t *Task, deadKey string) []clientv3.Op {
		return []clientv3.Op{clientv3.OpDelete(deadKey), clientv3.OpDelete(c.keys.Task(t.ID), clientv3.WithPrefix())}
	})
}

func (c *Client) eachDead(ctx context.Context, q string, ids []string, ops func(*Task, string) []clientv3.Op) (int, error) {
	if err := CheckQueue(q); err != nil {
		return 0, err
	}
	if len(ids) == 0 {
		g, err := c.cli.Get(ctx, c.keys.QueueDead(q), clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			return 0, fmt.Errorf("queue: dead-letter queue of %s: %w", q, err)
		}
		for _, kv := range g.Kvs {
			ids = append(ids, strings.TrimPrefix(string(kv.Key), c.keys.QueueDead(q)))
		}
	}
	sort.Strings(ids)
	n := 0
	for _, id := range ids {
		if err := keyspace.CheckName("task id", id); err != nil {
			return n, err
		}
		t, err := c.Get(ctx, id)
		if err != nil {
			return n, err
		}
		deadKey := c.keys.QueueDead(q) + id
		if t.Queue != q || t.CurrentStatus != Dead {
			return n, fmt.Errorf("%w: %s is %s in queue %s", ErrNotDead, id, t.CurrentStatus, t.Queue)
		}
		resp, err := c.cli.Txn(ctx).If(
			clientv3.Compare(clientv3.CreateRevision(deadKey), ">", 0),
			clientv3.Compare(clientv3.ModRevision(c.keys.TaskRecord(id)), "=", t.rev),
		).Then(ops(t, deadKey)...).Commit()
		if err != nil {
			return n, fmt.Errorf("queue: %s: %w", id, err)
		}
		if resp.Succeeded {
			n++
		}
	}
	return n, nil
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

// Config is a queue's settings, stored in etcd.
type Config struct {
	// MaxDepth bounds the queue's unfinished tasks (pending, running or
	// waiting to retry): a submission beyond it fails fast with
	// ErrQueueFull. 0 means no bound.
	MaxDepth int64 `json:"max_depth"`
	// FIFO puts every task submitted from now on into one shard of the
	// pending index, so that tasks of equal priority are claimed exactly
	// in submission order. The price: every claim's read counts the
	// whole queue (etcd counts every key of a range), so keep FIFO queues
	// to about 100,000 unfinished tasks.
	FIFO bool `json:"fifo,omitempty"`
}

// MaxMaxDepth is the largest maximum depth.
const MaxMaxDepth = 1 << 40

// GetConfig reads queue q's settings (the zero Config when none are set).
func (c *Client) GetConfig(ctx context.Context, q string) (Config, error) {
	if err := CheckQueue(q); err != nil {
		return Config{}, err
	}
	g, err := c.cli.Get(ctx, c.keys.QueueConfig(q))
	if err != nil {
		return Config{}, fmt.Errorf("queue: read settings of %s: %w", q, err)
	}
	var cfg Config
	if len(g.Kvs) == 1 {
		if err := json.Unmarshal(g.Kvs[0].Value, &cfg); err != nil {
			return Config{}, fmt.Errorf("queue: settings of %s are unreadable: %w", q, err)
		}
	}
	return cfg, nil
}

// SetConfig writes queue q's settings; submissions read them as they start.
func (c *Client) SetConfig(ctx context.Context, q string, cfg Config) error {
	return c.UpdateConfig(ctx, q, func(old *Config) { *old = cfg })
}

// UpdateConfig changes queue q's settings with change, in a compare-and-swap
// on the settings key, so that two concurrent changes of different fields
// both take effect.
func (c *Client) UpdateConfig(ctx context.Context, q string, change func(*Config)) error {
	if err := CheckQueue(q); err != nil {
		return err
	}
	var invalid error // the change's own error, returned as it is
	err := kv.Update(ctx, c.cli, c.keys.QueueConfig(q), func(old []byte) ([]byte, error) {
		var cfg Config
		if old != nil {
			if err := json.Unmarshal(old, &cfg); err != nil {
				invalid = fmt.Errorf("queue: settings of %s are unreadable: %w", q, err)
				return nil, invalid
			}
		}
		change(&cfg)
		if cfg.MaxDepth < 0 || cfg.MaxDepth > MaxMaxDepth {
			invalid = &drover.InputError{Field: "max depth", Value: cfg.MaxDepth, Rule: fmt.Sprintf("must be between 0 (no bound) and %d", int64(MaxMaxDepth))}
			return nil, invalid
		}
		return json.Marshal(cfg)
	})
	if err != nil && err != invalid {
		return fmt.Errorf("queue: settings of %s: %w", q, err)
	}
	return err
}

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
