// Package queue is drover's durable task queue on etcd, for millions of
// offline agent tasks: batched submission that is idempotent on task id,
// batched claims bound to the worker's lease and fenced, retries with
// exponential backoff and full jitter, a dead-letter queue, and cancellation.
//
// A fresh task lives in a segment: one key holding up to 100 tasks of one
// queue and priority level, written once at submission, with one small
// index key per task that makes its id idempotent (see keyspace and
// docs/queue.md). A segment's state is a few keys beside it, not per task:
// it is open while it has unfinished tasks; a claim is a run, one key
// bound to the worker's lease naming the slots it took (with a durable
// twin, its try, that keeps the attempts when the worker dies); outcomes
// are one key per batch of a run; a slot that leaves the segment
// (cancelled, purged) has an exit key. Only a task that leaves the common
// path (a failed attempt, the dead-letter queue, a hand-back, a
// cancellation) gets a record of its own, moved there in the same fenced
// transaction that records the outcome, with the per-task keys: a pending
// key, a claim key bound to the lease while it runs, a retry key while it
// waits for its backoff (a sleep key while a step task sleeps: see
// Steps), dead and done keys once finished. Because claims
// are lease-bound, a worker that dies releases its tasks by itself when
// its lease expires: no reaper, no timeout to tune. Every write a worker
// makes about a task is fenced by its claim's create revision (a run's,
// or a claim key's), so a worker that lost a claim cannot write.
//
// The package's types: Client submits, reads and administers tasks, and
// brokers the claims and reports of workers outside the process (the HTTP
// API's); Worker runs handlers, with a claimer that picks the segments and
// tasks to claim. The stored values of runs and outcomes, and the rule
// that a task id has one holder at a time (a queue worker or a task
// runner of package task), are package internal/taskstore's.
//
//	c, _ := queue.NewClient(cli, "drover")
//	res, _ := c.Submit(ctx, "emails", []queue.Task{{Type: "summarize", Parameters: params}}, nil)
//	w, _ := queue.NewWorker(ctx, cli, queue.WorkerConfig{Queue: "emails", Concurrency: 16})
//	w.Handle("summarize", func(ctx context.Context, t *queue.Task) ([]byte, error) { ... })
//	err := w.Run(ctx)
package queue

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/kv"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
)

// maxRequestBytes keeps every request well under etcd's 1.5 MiB limit.
const maxRequestBytes = 1 << 20

// submitInFlight is how many submit requests (segments) may be in flight at
// once for a queue without a maximum depth: etcd commits requests that
// arrive together in one batch and one fsync (16 against 4: 57,000–65,000
// against 48,000 tasks/s at 200,000, docs/bench-log/queue.md).
const submitInFlight = 16

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
	cli      *clientv3.Client
	keys     keyspace.Space
	now      func() time.Time
	segCache segmentCache
	// dueCounts keeps per queue what Stats last read of its due index
	// (seglist.go).
	dueCounts sync.Map
	// remote is the claim broker of workers outside this process (the
	// HTTP API's): the state their claims and reports share.
	remote broker
	// watches are the watches of queues that waits share (watchhub.go).
	watches watchHub
	// pauses is what its claims learned of their queues' pauses (pause.go).
	pauses pauseKnown
	// store reads step tasks' checkpoints and their children's plans and
	// outcomes (children.go).
	store *task.Store
	// tracer makes the spans of submissions and attempts (tracing).
	tracer trace.Tracer
}

// ClientOption sets an optional knob of a Client.
type ClientOption func(*Client)

// WithTracerProvider makes the client's spans with tp; the default is the
// global provider (otel.GetTracerProvider), a no-op unless set.
func WithTracerProvider(tp trace.TracerProvider) ClientOption {
	return func(c *Client) { c.tracer = otelspan.Tracer(tp) }
}

// NewClient returns a client of namespace ns ("" means "drover").
func NewClient(cli *clientv3.Client, ns string, opts ...ClientOption) (*Client, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		return nil, err
	}
	c := &Client{cli: cli, keys: keys, now: time.Now, store: store, tracer: otelspan.Tracer(nil)}
	for _, o := range opts {
		o(c)
	}
	c.remote.client = c
	return c, nil
}

// Spawner submits children for parents outside any queue's workers (HTTP
// agent tasks; see task.Store.CommitSpawn): parentQueue is the parent's
// queue, whose workers wake it as its children end, or "" for a parent
// that no queue parks (its next claim counts the children itself).
func (c *Client) Spawner(parentQueue string) task.Spawner {
	return childSpawner{c: c, q: parentQueue}
}

// Close stops what the Client runs in the background and waits for it,
// in this order: it marks the shared watches of its queues (watchhub.go)
// closed, so that none opens from now on; stops each, with its linger
// timer; then waits until their goroutines have returned, or until ctx
// ends (its error then says so). The claim broker of external workers
// (broker) starts no goroutine of its own: its claims and reports run in
// their callers' goroutines, and a wait it leads uses the shared watches.
// Call Close once the Workers, claims and waits that use the Client have
// returned: a wait started after it is served by no watch and ends at its
// timeout. It is idempotent and safe to call twice, or at once from two
// goroutines: each call returns once the watches have stopped. It does
// not close the etcd client.
func (c *Client) Close(ctx context.Context) error {
	return c.watches.shut(ctx)
}

// Shards is how many parts the pending index of a queue's tasks with records
// of their own (back from a retry, a requeue or a hand-back; fresh tasks are
// in segments) is split into, by a hash of the task id. etcd counts every
// key of a range it reads, even with a limit, so a claim reads one shard,
// never the whole index. Within a shard, tasks are ordered by
// priority, then submission time; priority levels have markers so that a
// claim reads the highest level first (see docs/flow.md); among equal
// priorities the order across shards is approximate.
const Shards = 16

func shardOf(id string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	return int(h.Sum32() % Shards)
}

// shardPrefix is the prefix of shard i of queue q's pending index.
func (c *Client) shardPrefix(q string, i int) string { return c.keys.QueueShard(q, i) }

// pendingKey is the task's key in the pending index: its shard, then higher
// priority first, then submission order.
func (c *Client) pendingKey(t *Task) string {
	shard := shardOf(t.ID)
	if t.Shard != nil {
		shard = *t.Shard
	}
	return c.keys.PendingKey(t.Queue, keyspace.Pending{Shard: shard, Level: MaxPriority - t.Metadata.Priority, Submitted: t.Metadata.CreatedAt, ID: t.ID})
}

// levelOf is the priority level part of a task's pending key: higher
// priorities sort first.
func levelOf(priority int) string { return keyspace.LevelName(MaxPriority - priority) }

// levelKey is the marker of priority level lv in queue q.
func (c *Client) levelKey(q, lv string) string { return c.keys.QueueLevel(q, lv) }

// levelOfPending returns the priority level of a pending key.
func (c *Client) levelOfPending(q, key string) string {
	p, ok := c.keys.ParsePendingKey(q, key)
	if !ok {
		return ""
	}
	return keyspace.LevelName(p.Level)
}

// pendingID returns the task id of a pending key, given the pending prefix.
func pendingID(key, prefix string) string {
	p, _ := keyspace.ParsePending(prefix, key)
	return p.ID
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

// retryKey is the task's key in the retry schedule.
func (c *Client) retryKey(t *Task) string {
	return c.keys.QueueRetryKey(t.Queue, t.ScheduledAt, t.ID)
}

// archived counts finished tasks removed after their retention period, so
// that Stats still counts them.
type archived struct {
	Succeeded int64 `json:"succeeded"`
	Cancelled int64 `json:"cancelled"`
	// SegmentSucceeded counts the tasks that succeeded in segments removed
	// after their retention.
	SegmentSucceeded int64 `json:"segment_succeeded,omitempty"`
}

// doneKey is a finished task's key in the done index: by finishing time, so
// that the oldest are removed first.
func (c *Client) doneKey(q string, st Status, at time.Time, id string) string {
	return c.keys.QueueDoneKey(q, string(st), at, id)
}

// DefaultRetention is how long finished tasks are kept by default.
const DefaultRetention = 24 * time.Hour

// sweepBatch is how many finished tasks one removal transaction takes: three
// deletes each, within etcd's 128 operations a request.
const sweepBatch = 40

// RemoveExpired removes queue q's tasks that SUCCEEDED or were CANCELLED
// more than retention ago: their records and done keys go, and the queue's
// archived counts grow by as many, in the same transaction, so Stats does
// not change. Several callers may run it at once; each removal is counted
// once. It returns how many tasks it removed.
func (c *Client) RemoveExpired(ctx context.Context, q string, retention time.Duration) (int, error) {
	if err := CheckQueue(q); err != nil {
		return 0, err
	}
	cutoff := c.now().Add(-retention).UnixNano()
	if _, err := c.closeFinished(ctx, q); err != nil {
		return 0, err
	}
	removed, err := c.removeExpiredSegments(ctx, q, cutoff, true)
	if err != nil {
		return removed, err
	}
	for _, st := range []Status{Succeeded, Cancelled} {
		pre := c.keys.QueueDone(q, string(st))
		for {
			g, err := c.cli.Txn(ctx).Then(
				clientv3.OpGet(pre, clientv3.WithRange(keyspace.TimeBound(pre, cutoff)), clientv3.WithLimit(sweepBatch), clientv3.WithKeysOnly()),
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
				_, id, _ := keyspace.ParseTimedKey(pre, string(kv.Key))
				cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
				// The record, and a step-wise task's checkpoint and steps.
				ops = append(ops, clientv3.OpDelete(string(kv.Key)), clientv3.OpDelete(c.keys.Task(id), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.TaskIndex(id)))
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
// out) and its context cancelled. The live children it spawned (see
// task.Spawn), except detached ones, are cancelled with it; a child's
// cancel is recorded for its parent. The cascade is not cut short by
// ctx (an HTTP client that goes away): it has cancelCascadeTimeout. A
// task cancelled already answers ErrFinished, after its cascade is run
// again, so that a cancel retried reaches the children a cut cascade
// left live.
func (c *Client) Cancel(ctx context.Context, id string) (*Task, error) {
	t, err := c.cancel(ctx, id)
	if !cancelCascades(t, err) {
		return t, err
	}
	if beforeCancelCascade != nil {
		beforeCancelCascade(id)
	}
	cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), cancelCascadeTimeout)
	defer stop()
	if cerr := c.cascade(cctx, t.Queue, id); cerr != nil {
		return t, errors.Join(err, cerr)
	}
	return t, err
}

// cancelCascadeTimeout bounds the cancels of a cancelled task's
// descendants.
const cancelCascadeTimeout = 2 * time.Minute

// cancelCascades reports whether a cancel that answered t and err is
// followed by the cancels of t's children: t was cancelled by it, or
// before it.
func cancelCascades(t *Task, err error) bool {
	return err == nil || errors.Is(err, ErrFinished) && t != nil && t.CurrentStatus == Cancelled
}

// cancel cancels task id alone.
func (c *Client) cancel(ctx context.Context, id string) (*Task, error) {
	t, _, err := c.cancelBy(ctx, id, nil)
	return t, err
}

func appendTransition(ts []Transition, tr Transition) []Transition {
	ts = append(ts, tr)
	if len(ts) > MaxHistory {
		ts = append(ts[:1], ts[len(ts)-MaxHistory+1:]...)
	}
	return ts
}

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
	if err != nil {
		return err
	}
	if _, err := c.cli.Txn(ctx).Then(c.nameOp(q)).Commit(); err != nil {
		return fmt.Errorf("queue: settings of %s: %w", q, err)
	}
	return nil
}

// The queue directory: every queue submitted to or configured, listed
// with its counts, and deleted whole.

// ErrNoQueue: no task was ever submitted to the queue and it has no
// settings; the name is probably misspelt.
var ErrNoQueue = errors.New("queue: no such queue")

// ErrQueueBusy: the queue has running tasks, so it cannot be deleted.
var ErrQueueBusy = errors.New("queue: has running tasks")

// QueueInfo is a queue of the directory with its counts.
type QueueInfo struct {
	Name  string `json:"name"`
	Stats Stats  `json:"stats"`
	// Config is the queue's settings.
	Config Config `json:"config"`
}

// Queues lists every queue that was submitted to or configured, by name,
// with its counts and settings.
func (c *Client) Queues(ctx context.Context) ([]QueueInfo, error) {
	pre := c.keys.QueueNames()
	out := []QueueInfo{}
	from := pre
	for {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(500))
		if err != nil {
			return nil, fmt.Errorf("queue: list queues: %w", err)
		}
		for _, kv := range g.Kvs {
			q, _ := keyspace.Last(pre, string(kv.Key))
			st, err := c.Stats(ctx, q)
			if err != nil {
				return nil, err
			}
			cfg, err := c.GetConfig(ctx, q)
			if err != nil {
				return nil, err
			}
			out = append(out, QueueInfo{Name: q, Stats: st, Config: cfg})
		}
		if !g.More || len(g.Kvs) == 0 {
			return out, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// Exists reports whether queue q is in the directory (it was submitted to
// or configured) or holds any key.
func (c *Client) Exists(ctx context.Context, q string) (bool, error) {
	if err := CheckQueue(q); err != nil {
		return false, err
	}
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.QueueName(q), clientv3.WithCountOnly()),
		clientv3.OpGet(c.keys.Queue(q), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("queue: look up queue %s: %w", q, err)
	}
	return resp.Responses[0].GetResponseRange().Count > 0 || len(resp.Responses[1].GetResponseRange().Kvs) > 0, nil
}

// noQueue returns an error matching ErrNoQueue for queue q.
func noQueue(q string) error {
	return fmt.Errorf("%w %s: nothing was ever submitted to it; check the name (drover queues list)", ErrNoQueue, q)
}

// nameOp registers queue q in the directory.
func (c *Client) nameOp(q string) clientv3.Op {
	return clientv3.OpPut(c.keys.QueueName(q), time.Now().UTC().Format(time.RFC3339))
}

// DeleteQueue deletes queue q and every task in it (pending, waiting to
// retry, dead or finished: records, checkpoints and index keys), then its
// settings and its entry in the directory. It refuses while tasks are
// running: stop the queue's workers (or cancel those tasks) first. Stop
// submitting to the queue first too: a task submitted during the deletion
// may survive it. progress, if set, is called with the number of tasks
// deleted so far.
func (c *Client) DeleteQueue(ctx context.Context, q string, progress func(done int)) (int, error) {
	ok, err := c.Exists(ctx, q)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, noQueue(q)
	}
	if err := c.noQuarantine(ctx, q); err != nil {
		return 0, err
	}
	st, err := c.Stats(ctx, q)
	if err != nil {
		return 0, err
	}
	if st.Running > 0 {
		return 0, fmt.Errorf("%w: queue %s has %d running tasks; stop its workers or cancel those tasks (drover tasks list --queue %s --status RUNNING), then delete it", ErrQueueBusy, q, st.Running, q)
	}
	n := 0
	// Those that wait on a due index before those pending: a sleep or a
	// retry that falls due while this runs goes to pending, and is
	// purged there, rather than from the index already purged.
	for _, s := range []Status{Scheduled, Sleeping, Waiting, Retrying, Pending, Dead, Succeeded, Cancelled} {
		base := n
		k, err := c.Purge(ctx, q, s, nil, func(done int) {
			if progress != nil {
				progress(base + done)
			}
		})
		n += k
		if err != nil {
			return n, err
		}
	}
	// What is left: settings, level markers, counts, cancel signals,
	// index keys of tasks whose record was gone, and the queue's child
	// wake and cascade marks (its tasks' cascades ran as they were purged).
	if _, err := c.cli.Txn(ctx).Then(clientv3.OpDelete(c.keys.Queue(q), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.QueueName(q)),
		clientv3.OpDelete(c.keys.Segments(q), clientv3.WithPrefix()),
		clientv3.OpDelete(c.keys.ChildCascades(q), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.ChildWakes(q), clientv3.WithPrefix())).Commit(); err != nil {
		return n, fmt.Errorf("queue: delete queue %s: %w", q, err)
	}
	return n, nil
}

// GetMany returns those of tasks ids that exist, with their current
// status, reading 40 a transaction; a missing id is left out, so callers
// match the tasks to ids by Task.ID.
func (c *Client) GetMany(ctx context.Context, ids []string) ([]*Task, error) {
	return c.getMany(ctx, ids)
}

// newIdempotencyKey is a random idempotency key, for a signal sent
// without one.
func newIdempotencyKey() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
