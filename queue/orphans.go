package queue

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

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

// runnerHeldFor is how long a task that a task runner holds is left out of
// claims before it is tried again.
const runnerHeldFor = time.Second

// runnerHolds notes that a task runner holds task id, so that claims leave
// it out for a while instead of failing on it again and again.
func (w *claimer) runnerHolds(id string) {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	now := time.Now()
	for k, until := range w.runnerHeld {
		if now.After(until) {
			delete(w.runnerHeld, k)
		}
	}
	w.runnerHeld[id] = now.Add(runnerHeldFor)
}

// runnerHeldWait is how long an idle worker waits for a change of the
// queue, at most limit: until the first task left out because a task runner
// held it is tried again, when there is one.
func (w *claimer) runnerHeldWait(limit time.Duration) time.Duration {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	now := time.Now()
	for id, until := range w.runnerHeld {
		switch d := until.Sub(now); {
		case d > 0:
			limit = min(limit, d)
		case -d < runnerHeldFor:
			// Its time is up, but no claim has tried it since (a claim
			// that does drops the entry: triedAgain): claim again soon.
			limit = min(limit, runnerRetryAfter)
		default:
			// No claim came to it for a whole second more (the task
			// left the queue's first segments): stop waking for it.
			delete(w.runnerHeld, id)
		}
	}
	return limit
}

// runnerRetryAfter is how soon an idle worker claims again when a task
// that was left out because a task runner held it may be tried again.
const runnerRetryAfter = 50 * time.Millisecond

// triedAgain reports whether a claim may take task id: no task runner was
// found holding it, or that was over runnerHeldFor ago, and then the claim
// tries it again and its entry goes (levelMu held).
func (w *claimer) triedAgain(id string, now time.Time) bool {
	until, ok := w.runnerHeld[id]
	if !ok {
		return true
	}
	if now.After(until) {
		delete(w.runnerHeld, id)
		return true
	}
	return false
}

// withoutRunnerHeld returns cands without the tasks a task runner was
// recently found holding.
func (w *claimer) withoutRunnerHeld(cands []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	if len(w.runnerHeld) == 0 {
		return cands
	}
	pre, now := w.keys.QueuePending(w.queue), time.Now()
	out := cands[:0:0]
	for _, kv := range cands {
		if w.triedAgain(pendingID(string(kv.Key), pre), now) {
			out = append(out, kv)
		}
	}
	return out
}
