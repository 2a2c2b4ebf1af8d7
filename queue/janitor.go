package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// promoteDue moves queue q's due retries, sleeping tasks and timed-out
// waits back to pending and its due scheduled segments to the open
// segments, until ctx ends: one watch and one timer each (package internal/due). Several workers may race for one
// item; each move is a transaction that only one wins.
func (w *Worker) promoteDue(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Add(4)
	sched := w.client.scheduledIndex(w.cfg.Queue)
	sched.Logger = w.logger
	// Segments due within DueGroup of each other move, and are gathered,
	// together: a task that waited for its segment's latest waits for
	// the bucket's too (a server's claims move without lingering).
	sched.Linger = DueGroup
	// The workers' movers take turns over a backlog's batches rather
	// than all gather each (Index.Turns): a turn is bound to a lease of
	// the mover's own that lives a few seconds and is not kept alive, and
	// each move is bounded, so a mover that hangs or stops holds a batch
	// no longer than that (docs/architecture.md, "Time: the due index").
	if dueTurns {
		sched.Turns = w.keys.QueueDueTurns(w.cfg.Queue)
	}
	go func() { defer wg.Done(); sched.Run(ctx) }()
	go func() { defer wg.Done(); w.client.waitIndex(w.cfg.Queue, w.logger).Run(ctx) }()
	go func() { defer wg.Done(); w.client.sleepIndex(w.cfg.Queue, w.logger).Run(ctx) }()
	go func() { defer wg.Done(); w.client.childWaker(w.cfg.Queue, w.logger).run(ctx) }()
	w.client.retryIndex(w.cfg.Queue, w.logger).Run(ctx)
}

// retryIndex is queue q's retry schedule as a due index: a due retry's
// pending key is written back, and its priority level's marker.
func (c *Client) retryIndex(q string, logger *slog.Logger) *due.Index {
	return &due.Index{Client: c.cli, Prefix: c.keys.QueueRetry(q), Batch: 50, Name: "retry", Logger: logger,
		Move: func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
			var rv retryValue
			if json.Unmarshal(kv.Value, &rv) != nil || rv.PendingKey == "" {
				logger.Error("queue: dropping an unreadable retry key", "key", string(kv.Key))
				return nil, false
			}
			return []clientv3.Op{clientv3.OpPut(rv.PendingKey, encodePending(rv.Attempts, false))}, true
		},
		Shared: func(kvs []*mvccpb.KeyValue) []clientv3.Op {
			var markers []clientv3.Op
			levels := map[string]bool{}
			for _, kv := range kvs {
				var rv retryValue
				if json.Unmarshal(kv.Value, &rv) != nil {
					continue
				}
				if lv := c.levelOfPending(q, rv.PendingKey); lv != "" && !levels[lv] {
					levels[lv] = true
					markers = append(markers, clientv3.OpPut(c.levelKey(q, lv), ""))
				}
			}
			return markers
		}}
}

// scheduledIndex is queue q's due index of segments that run later: a due
// segment's key moves to the open segments, where claims find it; the
// small segments of a batch falling due are gathered into full ones
// (gatherDue).
func (c *Client) scheduledIndex(q string) *due.Index {
	pre := c.keys.QueueDue(q)
	return &due.Index{Client: c.cli, Prefix: pre, Now: c.now, Name: "scheduled", Parallel: dueParallel,
		Move: func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
			seg, _, _ := c.parseDue(q, string(kv.Key))
			if seg == "" {
				return nil, false
			}
			return []clientv3.Op{clientv3.OpPut(c.keys.SegmentOpen(q, seg), string(kv.Value))}, true
		},
		Gather: func(ctx context.Context, kvs []*mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, error) {
			return c.gatherDue(ctx, q, kvs)
		},
		Shared: func([]*mvccpb.KeyValue) []clientv3.Op {
			return []clientv3.Op{clientv3.OpPut(c.keys.QueueDueVersion(q), "")} // Stats' count is stale
		}}
}

// dueParallel is how many batches of due segments a mover moves at once
// when a backlog is due (due.Index.Parallel): a batch of 64 segments of
// ~3 tasks (a million tasks due over a minute, submitted 10,000 a
// request) is ~200 tasks, and one batch a round trip at a time moved
// fewer than the 16,700 tasks a second falling due.
const dueParallel = 4

// dueTurns says whether the workers' movers take turns (due.Index.Turns);
// only a measurement of them against none turns it off.
var dueTurns = true

// watchCancels cancels the context of a running task when someone asks to
// cancel it. The first watch resumes after from (0: from when it is set
// up).
func (w *Worker) watchCancels(ctx context.Context, from int64) {
	pre := w.keys.QueueCancel(w.cfg.Queue)
	last := from // the last revision seen: a reopened watch resumes after it
	if hook := testHookWatchOpen.Load(); hook != nil {
		(*hook)()
	}
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete()}
		if last > 0 {
			opts = append(opts, clientv3.WithRev(last+1))
		}
		wch := w.cli.Watch(clientv3.WithRequireLeader(ctx), pre, opts...)
		for wr := range wch {
			if wr.CompactRevision > 0 {
				last = 0 // fell behind compaction: start from now
			} else if wr.Header.Revision > last {
				last = wr.Header.Revision
			}
			for _, ev := range wr.Events {
				id, _ := keyspace.Last(pre, string(ev.Kv.Key))
				w.mu.Lock()
				if r := w.inflight[id]; r != nil {
					r.cancel(ErrCancelled)
				}
				w.mu.Unlock()
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// afterLostRace waits a random moment of up to 20 ms (or until ctx ends)
// before a claim that lost its tasks to others tries again, so that the
// claims that lost do not meet again at once.
func afterLostRace(ctx context.Context) {
	sleepCtx(ctx, raceGap())
}

// raceGap is how long a claim that lost a race waits before it tries
// again: a random moment of 1 to 20 ms (never 0, which waitForWork takes
// for "no bound").
func raceGap() time.Duration {
	return time.Millisecond + time.Duration(rand.Int64N(int64(19*time.Millisecond)))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// removeExpired removes finished tasks past their retention, every
// retention/24 (between a minute and an hour), until ctx ends.
func (w *Worker) removeExpired(ctx context.Context) {
	if w.cfg.Retention < 0 {
		return
	}
	every := min(max(w.cfg.Retention/24, time.Minute), time.Hour)
	for {
		if n, err := w.client.RemoveExpired(ctx, w.cfg.Queue, w.cfg.Retention); err != nil && ctx.Err() == nil {
			w.logger.Warn("queue: removing expired tasks failed; trying again later", "queue", w.cfg.Queue, "err", err)
		} else if n > 0 {
			w.logger.Info("queue: removed expired tasks", "queue", w.cfg.Queue, "tasks", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// countDepth sets the drover_queue_tasks gauges every DepthInterval.
func (w *Worker) countDepth(ctx context.Context) {
	if w.cfg.DepthInterval <= 0 {
		return
	}
	t := time.NewTicker(w.cfg.DepthInterval)
	defer t.Stop()
	for {
		if st, err := w.client.Stats(ctx, w.cfg.Queue); err == nil {
			q := w.cfg.Queue
			for state, n := range st.ByState() {
				metrics.QueueTasks.WithLabelValues(q, state).Set(float64(n))
			}
			metrics.QueuePaused.WithLabelValues(q).Set(map[bool]float64{true: 1}[st.Paused])
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// maxOrphans bounds the ids an orphan list holds; past it, ids are dropped
// and the claim's shard reads find those tasks instead, later.
const maxOrphans = 10000

// orphanList holds the ids of tasks whose claim vanished while their pending
// key stayed: their worker died (its lease expired) or handed them back.
// Such a task is claimable at once, but a claim finds it by reading shards
// only when its rotating read reaches the task's shard, which in a large
// backlog takes many claims; the list lets the next claim take it first.
type orphanList struct {
	mu    sync.Mutex
	ids   []string
	wake  chan struct{} // closed, and replaced, when ids are added
	known map[string]bool
}

func newOrphanList() *orphanList {
	return &orphanList{wake: make(chan struct{}), known: map[string]bool{}}
}

// add appends ids not already listed and wakes waiting claimers.
func (o *orphanList) add(ids []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	added := false
	for _, id := range ids {
		if len(o.ids) < maxOrphans && !o.known[id] {
			o.ids, o.known[id], added = append(o.ids, id), true, true
		}
	}
	if added {
		close(o.wake)
		o.wake = make(chan struct{})
	}
}

// first returns the oldest id listed, without removing it ("" for none).
func (o *orphanList) first() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.ids) == 0 {
		return ""
	}
	return o.ids[0]
}

// remove takes id off the list.
func (o *orphanList) remove(id string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.known[id] {
		return
	}
	delete(o.known, id)
	for i, x := range o.ids {
		if x == id {
			o.ids = append(o.ids[:i], o.ids[i+1:]...)
			break
		}
	}
}

// take removes and returns up to n ids, in random order so that workers
// that all heard of the same orphans try them in different orders.
func (o *orphanList) take(n int) []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	n = min(n, len(o.ids))
	if n == 0 {
		return nil
	}
	rand.Shuffle(len(o.ids), func(i, j int) { o.ids[i], o.ids[j] = o.ids[j], o.ids[i] })
	out := append([]string(nil), o.ids[:n]...)
	o.ids = append(o.ids[:0], o.ids[n:]...)
	for _, id := range out {
		delete(o.known, id)
	}
	return out
}

// watchOrphans follows the deletions under the queue's keys and lists the
// tasks whose claim was deleted without their pending key in the same
// revision (an outcome deletes both at once; a lease that expires deletes
// only the claim). Watch, don't poll: the DELETE event of the dead worker's
// claims is what gets its tasks run again within about the lease's TTL.
// The first watch resumes after from (0: from when it is set up).
func (w *Worker) watchOrphans(ctx context.Context, from int64) {
	q := w.cfg.Queue
	last := from // the last revision seen: a reopened watch resumes after it
	if hook := testHookWatchOpen.Load(); hook != nil {
		(*hook)()
	}
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterPut(), clientv3.WithCreatedNotify()}
		if last > 0 {
			opts = append(opts, clientv3.WithRev(last+1))
		}
		wctx, cancel := context.WithCancel(ctx)
		wch := w.cli.Watch(clientv3.WithRequireLeader(wctx), w.keys.Queue(q), opts...)
		for wr := range wch {
			if wr.Err() != nil {
				if wr.CompactRevision > 0 {
					last = 0 // missed some: the shard reads find those
				}
				break
			}
			if ids := w.orphaned(wr.Events); len(ids) > 0 {
				w.sched.lost.add(w.loseOwn(ids))
			}
			if segs := w.orphanedRuns(wr.Events); len(segs) > 0 {
				w.sched.lostSegs.add(segs)
			}
			if len(wr.Events) > 0 {
				last = wr.Events[len(wr.Events)-1].Kv.ModRevision
			} else if last == 0 {
				last = wr.Header.Revision
			}
		}
		cancel()
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// testHookWatchOpen, when set by a test, runs before the worker's watches
// are first set up (to delay them past a claim).
var testHookWatchOpen atomic.Pointer[func()]

// currentRevision is the store's revision now, or 0 when it cannot be read.
func (w *Worker) currentRevision(ctx context.Context) int64 {
	resp, err := w.cli.Get(ctx, w.keys.Queue(w.cfg.Queue), clientv3.WithKeysOnly())
	if err != nil {
		return 0
	}
	return resp.Header.Revision
}

// lostClaim is a claim deleted without its task's pending key: the task's id
// and the revision of the deletion.
type lostClaim struct {
	id  string
	rev int64
}

// loseOwn cancels the running tasks of this worker among lost (their claim
// is gone: the lease was revoked or expired before this process noticed),
// at once rather than at the lease's next renewal, and returns the ids of
// all of them.
func (w *Worker) loseOwn(lost []lostClaim) []string {
	ids := make([]string, len(lost))
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, l := range lost {
		ids[i] = l.id
		// Only a deletion after this worker's claim was made is of its
		// claim: an older one is a predecessor's, delivered late.
		if r := w.inflight[l.id]; r != nil && l.rev > r.token {
			r.cancel(fmt.Errorf("%w: the claim of task %s was deleted (its lease ended)", lock.ErrLost, l.id))
		}
	}
	return ids
}

// orphaned returns the claims whose deletion in events came without the
// deletion of their pending key at the same revision. etcd delivers all
// events of one revision in one response.
func (w *Worker) orphaned(events []*clientv3.Event) []lostClaim {
	q := w.cfg.Queue
	pre, claims := w.keys.QueuePending(q), w.keys.QueueClaims(q)
	type at struct {
		id  string
		rev int64
	}
	pendingGone := map[at]bool{}
	for _, ev := range events {
		if k := string(ev.Kv.Key); strings.HasPrefix(k, pre) {
			pendingGone[at{pendingID(k, pre), ev.Kv.ModRevision}] = true
		}
	}
	var lost []lostClaim
	for _, ev := range events {
		if id, ok := keyspace.Last(claims, string(ev.Kv.Key)); ok && !pendingGone[at{id, ev.Kv.ModRevision}] {
			lost = append(lost, lostClaim{id, ev.Kv.ModRevision})
		}
	}
	return lost
}

// orphanedRuns returns the segments of the runs whose deletion in events
// came without the deletion of their try at the same revision (an outcome
// deletes both; a lease that expires only the run): their unfinished tasks
// are claimable again. This worker's own such runs have their tasks
// cancelled at once.
func (w *Worker) orphanedRuns(events []*clientv3.Event) []string {
	q := w.cfg.Queue
	runs, tries := w.keys.Runs(q, ""), w.keys.Tries(q, "")
	type at struct {
		key string
		rev int64
	}
	tryGone := map[at]bool{}
	for _, ev := range events {
		if seg, rest, ok := keyspace.SegmentPart(tries, string(ev.Kv.Key)); ok {
			tryGone[at{seg + "/" + rest, ev.Kv.ModRevision}] = true
		}
	}
	var segs []string
	for _, ev := range events {
		seg, rest, ok := keyspace.SegmentPart(runs, string(ev.Kv.Key))
		if !ok || tryGone[at{seg + "/" + rest, ev.Kv.ModRevision}] {
			continue
		}
		segs = append(segs, seg)
		w.mu.Lock()
		for id, r := range w.inflight {
			if r.runKey == string(ev.Kv.Key) && ev.Kv.ModRevision > r.token {
				r.cancel(fmt.Errorf("%w: the run of task %s was deleted (its lease ended)", lock.ErrLost, id))
			}
		}
		w.mu.Unlock()
	}
	return segs
}

// orphanCandidates reads the pending keys of the tasks ids (at most a
// claim's worth, so within etcd's operations per request): their records
// say where the keys are.
// Tasks that have finished since, or whose record is gone, are left out.
func (w *claimer) orphanCandidates(ctx context.Context, ids []string) ([]*mvccpb.KeyValue, error) {
	ops := make([]clientv3.Op, len(ids))
	for i, id := range ids {
		ops[i] = clientv3.OpGet(w.keys.TaskRecord(id))
	}
	resp, err := w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	ops = ops[:0]
	for _, r := range resp.Responses {
		kvs := r.GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue
		}
		var t Task
		if json.Unmarshal(kvs[0].Value, &t) != nil || t.Queue != w.queue || t.CurrentStatus.Terminal() {
			continue
		}
		ops = append(ops, clientv3.OpGet(w.client.pendingKey(&t)))
	}
	if len(ops) == 0 {
		return nil, nil
	}
	resp, err = w.cli.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return nil, err
	}
	var out []*mvccpb.KeyValue
	for _, r := range resp.Responses {
		out = append(out, r.GetResponseRange().Kvs...)
	}
	return out, nil
}

// lostAttempt is the error of an attempt whose worker never wrote its
// outcome.
const lostAttempt = "lost: its worker's lease ended before it recorded an outcome (the worker died, or was cut off from etcd past its TTL)"

// appendLost adds a RUNNING transition for every attempt before attempt
// that started but left no trace in ts (its worker died before writing an
// outcome, so nothing wrote the record), stamped at, when the loss was
// noticed. Attempts count from the last submission or requeue (a PENDING
// transition of attempt 0).
func appendLost(ts []Transition, attempt int, at time.Time) []Transition {
	last := 0
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].Status == Pending && ts[i].Attempt == 0 {
			break
		}
		last = max(last, ts[i].Attempt)
	}
	for k := last + 1; k < attempt; k++ {
		ts = appendTransition(ts, Transition{Status: Running, At: at, Attempt: k, Error: lostAttempt})
	}
	return ts
}

// runnerRetryAfter is how soon an idle worker claims again when a task
// that was left out because a task runner held it may be tried again.
const runnerRetryAfter = 50 * time.Millisecond

// gatherWrites are the writes of a gathered move of srcs (gatherDue): the
// open keys of the sources not gathered, the deletions of the records of
// those gathered, and the new segments (gatheredSegment), each of sources
// of one level due within DueGroup of its first (named after the latest,
// it takes no place ahead of an older segment), with one
// compare per new segment that no record has its name.
func (c *Client) gatherWrites(q string, srcs []dueSource) ([]clientv3.Cmp, []clientv3.Op, error) {
	if !leaveLone(srcs) {
		return nil, nil, nil
	}
	var first []clientv3.Op
	var levels []int
	gathered := map[int][]dueSource{}
	for _, s := range srcs {
		if s.tasks == nil {
			first = append(first, clientv3.OpPut(c.keys.SegmentOpen(q, s.seg), strconv.Itoa(s.n)))
			continue
		}
		first = append(first, clientv3.OpDelete(c.keys.Segment(q, s.seg)))
		if gathered[s.level] == nil {
			levels = append(levels, s.level)
		}
		gathered[s.level] = append(gathered[s.level], s)
	}
	ops := first
	var cmps []clientv3.Cmp
	for _, lv := range levels {
		var cur []Task
		var from, due time.Time // the chunk's first and latest due times
		size := 0
		flush := func() error {
			cmp, seg, err := c.gatheredSegment(q, lv, due, cur)
			cmps, ops, cur, due, size = append(cmps, cmp), append(ops, seg...), nil, time.Time{}, 0
			return err
		}
		for _, s := range gathered[lv] {
			if len(cur) > 0 && s.due.Sub(from) > DueGroup { // FIFO: named after its latest, no later than DueGroup
				if err := flush(); err != nil {
					return nil, nil, err
				}
			}
			if len(cur) == 0 {
				from = s.due
			}
			for i := range s.tasks {
				t := &s.tasks[i]
				if len(cur) == SegmentSize || (len(cur) > 0 && size+recordSize(t) > maxSegmentBytes) {
					if err := flush(); err != nil {
						return nil, nil, err
					}
				}
				cur, size = append(cur, *t), size+recordSize(t)
				if s.due.After(due) {
					due = s.due
				}
			}
		}
		if err := flush(); err != nil {
			return nil, nil, err
		}
	}
	return cmps, ops, nil
}

// gatheredSuffix is the random part of a gathered segment's name (a
// variable: tests make names collide).
var gatheredSuffix = func() string { return scheduledMark + NewID()[:15] }

// gatheredSegment are the writes of tasks as a new segment of queue q and
// level lv, due at due (the latest of its sources' times, passed: it
// opens at once): its record, its open key, and its tasks' index keys
// pointing at it, and the compare that no record has its name (a closed
// or scheduled segment of that name would lose tasks or mark the new
// slots done: the move then fails and its sources move one by one). Its
// name carries the scheduled mark and 60 random bits: its tasks' history
// says SCHEDULED, then PENDING at due.
func (c *Client) gatheredSegment(q string, lv int, due time.Time, tasks []Task) (clientv3.Cmp, []clientv3.Op, error) {
	seg := keyspace.SegmentName(lv, due, gatheredSuffix())
	absent := clientv3.Compare(clientv3.CreateRevision(c.keys.Segment(q, seg)), "=", 0)
	data, err := encodeSegment(tasks)
	if err != nil {
		return absent, nil, fmt.Errorf("queue: gather due segments of %s: %w", q, err)
	}
	ops := make([]clientv3.Op, 0, len(tasks)+2)
	ops = append(ops, clientv3.OpPut(c.keys.Segment(q, seg), string(data)), clientv3.OpPut(c.keys.SegmentOpen(q, seg), strconv.Itoa(len(tasks))))
	for slot := range tasks {
		ops = append(ops, clientv3.OpPut(c.keys.TaskIndex(tasks[slot].ID), keyspace.TaskPlace{Queue: q, Segment: seg, Slot: slot}.String()))
	}
	return absent, ops, nil
}
