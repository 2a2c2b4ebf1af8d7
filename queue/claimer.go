package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// claimer picks the segments and tasks of one queue to claim, and claims
// them, under one lease for one worker: a Worker's claim loops share one,
// and each external claim (Client.Claim) has one, with what the claims
// before it left (brokerclaim.go). It owns the claim scheduling state: which
// segment each claim loop took from last and what that claim left of it,
// the open segments the last list found, the segments and priority levels
// seen busy, the tasks and segments whose claims were lost, the tasks a
// task runner holds, and the turns that keep lower levels from starving.
type claimer struct {
	cli    *clientv3.Client
	keys   keyspace.Space
	client *Client
	queue  string
	lease  *lease.Lease
	worker string
	runID  string // names the runs: unique, where worker ids may not be
	logger *slog.Logger

	claimed     atomic.Int64 // tasks claimed (the Worker's stats)
	shardCursor atomic.Int64
	claimSeq    atomic.Int64
	turnSeq     atomic.Int64 // claims that took something: the priority turns count these
	runSeq      atomic.Int64
	fifo        atomic.Bool // the queue was FIFO at the last claim
	fifoMu      sync.Mutex  // taken by claims of a FIFO queue

	levelMu    sync.Mutex
	busyLevels map[string]time.Time   // priority levels whose tasks all run, until when (levelMu)
	lost       *orphanList            // tasks whose claim vanished: claimed first
	runnerHeld map[string]time.Time   // tasks a task runner holds, skipped until when (levelMu)
	busySegs   map[string]time.Time   // segments whose slots all run, skipped until when (levelMu)
	foreign    map[string]time.Time   // segments of a format this worker does not know, warned of until when (levelMu)
	turns      levelTurns             // the anti-starvation turns of segments' levels (levelMu)
	window     openWindow             // bounds the read of the open segments (levelMu)
	noted      int64                  // every segment opened up to this revision was told to window (0: not known; levelMu; see claimWait)
	windowAt   int64                  // the revision of the latest read or event the window took in (levelMu; see sawOpen)
	windowGen  int64                  // counts the times an event or a missed wait made the window unknown (levelMu; see sawOpen)
	lostSegs   *orphanList            // segments a dead worker's run left tasks in: claimed first
	hot        [claimers]string       // per claim loop, the segment it took from last, with slots left (levelMu)
	predicted  [claimers]*segState    // per claim loop, hot's state as its last claim left it (levelMu)
	lastListed []string               // the open segments the last list read found, in order (levelMu)
	listedAll  []string               // the same, never trimmed by nextListed (levelMu)
	guessed    [claimers]bool         // per claim loop, hot is the next of the last list, not yet confirmed (levelMu)
	laneClaims [claimers]atomic.Int64 // per claim loop, its claims: one in readEvery reads first
	spread     uint64                 // an external claim's turn: where in the open segments it starts (0: at random among the first)
	pickN      int                    // the most segments pickSegments returns (0: 8)
}

// newClaimer is a claimer of queue q of client's namespace, claiming
// under l (set later, before the first claim, when nil) as worker.
func newClaimer(client *Client, q string, l *lease.Lease, worker string, logger *slog.Logger) *claimer {
	return &claimer{cli: client.cli, keys: client.keys, client: client, queue: q, lease: l, worker: worker, runID: NewID()[:12], logger: logger,
		busyLevels: map[string]time.Time{}, lost: newOrphanList(), runnerHeld: map[string]time.Time{},
		busySegs: map[string]time.Time{}, foreign: map[string]time.Time{}, lostSegs: newOrphanList()}
}

// isBusy reports whether seg is marked busy.
func (w *claimer) isBusy(seg string) bool {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	until, ok := w.busySegs[seg]
	return ok && time.Now().Before(until)
}

// notBusy returns the names of the open segments kvs that are not known to
// have all their slots running.
func (w *claimer) notBusy(pre string, kvs []*mvccpb.KeyValue) []string {
	now := time.Now()
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	var out []string
	for _, kv := range kvs {
		name, ok := keyspace.Last(pre, string(kv.Key))
		if !ok {
			continue
		}
		if until, busy := w.busySegs[name]; busy && now.Before(until) {
			continue
		}
		out = append(out, name)
	}
	for k, until := range w.busySegs {
		if now.After(until) {
			delete(w.busySegs, k)
		}
	}
	return out
}

// quarantined is the value of a quarantined segment's key.
type quarantined struct {
	Tasks   string    `json:"tasks"` // the open key's value: its number of tasks
	Error   string    `json:"error"`
	Worker  string    `json:"worker"`
	At      time.Time `json:"at"`
	Segment int64     `json:"segment_rev"` // the mod revision of the segment's value
}

// quarantine takes segment seg, whose value kv could not be decoded
// (cause), out of the queue's open segments, so that the claims behind
// it (all of them, in a FIFO queue) go on: one transaction, refused if
// the value or the open key changed since, deletes the open key and
// writes the quarantine key (keyspace SegmentQuarantined), which names
// the number of tasks and the error. The segment's value and its tasks'
// index keys stay as they were, for an operator to read or repair;
// nothing is dropped. It logs and counts (drover_segments_quarantined_total)
// the move.
func (w *claimer) quarantine(ctx context.Context, seg string, kv *mvccpb.KeyValue, cause error) error {
	q := w.queue
	w.markBusy(seg)
	w.lostSegs.remove(seg)
	openKey, qKey := w.keys.SegmentOpen(q, seg), w.keys.SegmentQuarantined(q, seg)
	g, err := w.cli.Get(ctx, openKey)
	if err != nil {
		return fmt.Errorf("queue: quarantine segment %s of %s: %w", seg, q, err)
	}
	if len(g.Kvs) == 0 {
		return nil // closed or quarantined by another worker meanwhile
	}
	v, _ := json.Marshal(quarantined{Tasks: string(g.Kvs[0].Value), Error: cause.Error(), Worker: w.worker, At: w.client.now().UTC(), Segment: kv.ModRevision})
	resp, err := w.cli.Txn(ctx).If(
		clientv3.Compare(clientv3.ModRevision(w.keys.Segment(q, seg)), "=", kv.ModRevision),
		clientv3.Compare(clientv3.ModRevision(openKey), "=", g.Kvs[0].ModRevision),
	).Then(clientv3.OpDelete(openKey), clientv3.OpPut(qKey, string(v))).Commit()
	if err != nil {
		return fmt.Errorf("queue: quarantine segment %s of %s: %w", seg, q, err)
	}
	if resp.Succeeded {
		metrics.SegmentsQuarantined.WithLabelValues(q).Inc()
		w.logger.Error("queue: a segment's value cannot be decoded; moved it to quarantine so that claims go on (its tasks are kept, not run)",
			"queue", q, "segment", seg, "tasks", string(g.Kvs[0].Value), "key", qKey, "err", cause)
	}
	return nil
}

// quarantineIfUndecodable reads segment seg, which a read of several
// segments found open with no tasks it could decode, and quarantines it
// when its value does not decode (it may have been removed meanwhile).
func (w *claimer) quarantineIfUndecodable(ctx context.Context, seg string) {
	g, err := w.cli.Get(ctx, w.keys.Segment(w.queue, seg))
	if err != nil || len(g.Kvs) == 0 {
		return
	}
	if _, err := w.client.cacheSegment(w.queue, seg, g.Kvs[0].Value); errors.Is(err, errSegmentFormat) {
		w.skipForeign(seg, err)
	} else if err != nil {
		if qerr := w.quarantine(ctx, seg, g.Kvs[0], err); qerr != nil {
			w.logger.Warn("queue: could not quarantine an undecodable segment; will try again", "queue", w.queue, "segment", seg, "err", qerr)
		}
	}
}

// skipForeign skips segment seg, whose value is of a format this worker
// does not know (err, errSegmentFormat): a newer drover wrote it, during a
// rolling upgrade, and a worker that knows the format runs its tasks; it
// is not quarantined. The worker warns of it once a minute and counts it
// once (drover_segments_unknown_format_total). A queue of any order
// claims the segments after it meanwhile; a FIFO queue's claims by this
// worker wait for it, as its tasks come first.
func (w *claimer) skipForeign(seg string, err error) {
	w.levelMu.Lock()
	until, seen := w.foreign[seg]
	warn := !seen || time.Now().After(until)
	if warn {
		if len(w.foreign) >= 1024 { // bounded: forget those warned of before
			clear(w.foreign)
		}
		w.foreign[seg] = time.Now().Add(time.Minute)
	}
	w.levelMu.Unlock()
	if !w.fifo.Load() {
		w.markBusy(seg)
	}
	if !seen {
		metrics.SegmentsUnknownFormat.WithLabelValues(w.queue).Inc()
	}
	if warn {
		w.logger.Warn("queue: a segment is of a format this worker does not know (written by a newer drover?); skipping it, not quarantining it: a worker that knows the format runs its tasks",
			"queue", w.queue, "segment", seg, "key", w.keys.Segment(w.queue, seg), "err", err)
	}
}

// markBusy skips segment seg for a while (all its slots run, or it is done).
func (w *claimer) markBusy(seg string) {
	w.levelMu.Lock()
	w.busySegs[seg] = time.Now().Add(segBusyFor)
	w.levelMu.Unlock()
}

// forgetBusy forgets every segment marked busy: an external claim that
// waited in line did not see the runs that ended meanwhile (the line's
// leader did).
func (w *claimer) forgetBusy() {
	w.levelMu.Lock()
	clear(w.busySegs)
	w.levelMu.Unlock()
}

// unmarkBusy forgets that seg was marked busy: a run of it ended.
func (w *claimer) unmarkBusy(seg string) {
	w.levelMu.Lock()
	delete(w.busySegs, seg)
	w.levelMu.Unlock()
}

// notOthersHot returns cands without the segments the worker's other claim
// loops are taking from (two loops on one segment spoil each other's
// claims), unless that leaves none.
func (w *claimer) notOthersHot(lane int, cands []string) []string {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	var out []string
	for _, seg := range cands {
		taken := false
		for l, h := range w.hot {
			taken = taken || l != lane && h == seg
		}
		if !taken {
			out = append(out, seg)
		}
	}
	if len(out) == 0 {
		return cands
	}
	return out
}

// segBusyFor is how long a segment whose slots all run is skipped.
const segBusyFor = 2 * time.Second

// hotSegment is the segment claim loop lane takes from next: the one it
// took from last, if it had slots left, or (guessed) the next one of its
// last list.
func (w *claimer) hotSegment(lane int) (seg string, guessed bool) {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	return w.hot[lane], w.guessed[lane]
}

func (w *claimer) setHot(lane int, seg string) {
	w.levelMu.Lock()
	w.hot[lane], w.predicted[lane], w.guessed[lane] = seg, nil, false
	w.levelMu.Unlock()
}

// setGuess makes seg, the next segment of the loop's last list, the one
// claim loop lane reads with its next claim's first read, if the priority
// rule agrees then (stillFirst).
func (w *claimer) setGuess(lane int, seg string) {
	w.levelMu.Lock()
	w.hot[lane], w.predicted[lane], w.guessed[lane] = seg, nil, seg != ""
	w.levelMu.Unlock()
}

// stillFirst reports whether the loop's segment may be claimed from on the
// list r read: always when the loop took from it before; a guessed one only
// when it is of the list's highest level and the claim is not a lower
// level's turn (see levelTurns).
func (w *claimer) stillFirst(lane int, r segmentRead) bool {
	if _, guessed := w.hotSegment(lane); !guessed {
		return true
	}
	if r.seq%8 == 0 || len(r.open) == 0 {
		return false
	}
	return !w.belowTop(r.hot.name, r.open)
}

// listed records the open segments a list read found (in order), from
// which a claim loop that used up its segment takes the next.
func (w *claimer) listed(open []*mvccpb.KeyValue) {
	pre := w.keys.SegmentsOpen(w.queue)
	names := make([]string, 0, len(open))
	for _, kv := range open {
		if name, ok := keyspace.Last(pre, string(kv.Key)); ok {
			names = append(names, name)
		}
	}
	w.levelMu.Lock()
	w.lastListed, w.listedAll = names, names
	w.levelMu.Unlock()
}

// nextListed returns the first segment of the last list after done that
// no claim loop takes from and that is not known busy, or "" for none: the
// claim loop that used up done reads it with its next claim's first read.
func (w *claimer) nextListed(lane int, done string) string {
	now := time.Now()
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	for i, name := range w.lastListed {
		if name == done {
			w.lastListed = w.lastListed[i+1:]
			break
		}
	}
	for _, name := range w.lastListed {
		if until, busy := w.busySegs[name]; busy && now.Before(until) {
			continue
		}
		if slices.Contains(w.hot[:], name) {
			continue
		}
		return name
	}
	return ""
}

// setPredicted makes seg, as st says it is, the segment claim loop lane
// takes from next.
func (w *claimer) setPredicted(lane int, st *segState) {
	w.levelMu.Lock()
	w.hot[lane], w.predicted[lane], w.guessed[lane] = st.name, st, false
	w.levelMu.Unlock()
}

// withoutRunnerHeldSlots returns free without the slots whose task a task
// runner was recently found holding.
func (w *claimer) withoutRunnerHeldSlots(ts []Task, free []int) []int {
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	if len(w.runnerHeld) == 0 {
		return free
	}
	now := time.Now()
	out := free[:0:0]
	for _, s := range free {
		if s >= len(ts) {
			continue
		}
		if w.triedAgain(ts[s].ID, now) {
			out = append(out, s)
		}
	}
	return out
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

// ErrQuarantined is the error of reading a task whose segment was
// quarantined, its value undecodable (see docs/queue.md), and of deleting
// a queue that holds such segments.
var ErrQuarantined = errors.New("queue: quarantined")

// unreadable returns err, the error of decoding segment seg of queue q,
// as ErrQuarantined naming the segment's keys when it was quarantined.
func (c *Client) unreadable(ctx context.Context, q, seg string, err error) error {
	g, gerr := c.cli.Get(ctx, c.keys.SegmentQuarantined(q, seg), clientv3.WithCountOnly())
	if gerr != nil || g.Count == 0 {
		return err
	}
	return fmt.Errorf("%w: the task's segment %s (its value undecodable) is quarantined, see %s; repair it as docs/queue.md says: %w",
		ErrQuarantined, c.keys.Segment(q, seg), c.keys.SegmentQuarantined(q, seg), err)
}

// noQuarantine refuses the deletion of queue q while it holds quarantined
// segments: their tasks cannot be read, so a purge cannot delete their
// index keys, and their ids would stay taken.
func (c *Client) noQuarantine(ctx context.Context, q string) error {
	g, err := c.cli.Get(ctx, c.keys.SegmentsQuarantined(q), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1))
	if err != nil {
		return fmt.Errorf("queue: delete queue %s: %w", q, err)
	}
	if g.Count == 0 {
		return nil
	}
	seg, _ := keyspace.Last(c.keys.SegmentsQuarantined(q), string(g.Kvs[0].Key))
	return fmt.Errorf("%w: queue %s holds %d quarantined segments (the first %s): their tasks cannot be read, so deleting the queue would leave their ids taken; "+
		"repair each segment's value at %s and reopen it (docs/queue.md), or delete the index keys under %s whose value starts with %q and then %s, and delete the queue again",
		ErrQuarantined, q, g.Count, seg, c.keys.Segment(q, seg), c.keys.TaskIndex(""), q+"/"+seg+"/", g.Kvs[0].Key)
}

// getSkipping is getMany leaving out the tasks of quarantined segments
// and of segments of a format this drover does not know (a search skips
// both; a newer drover's servers search the latter): after a read that
// met one, one task at a time.
func (c *Client) getSkipping(ctx context.Context, ids []string) ([]*Task, error) {
	skipped := func(err error) bool { return errors.Is(err, ErrQuarantined) || errors.Is(err, errSegmentFormat) }
	out, err := c.getMany(ctx, ids)
	if !skipped(err) {
		return out, err
	}
	out = nil
	for _, id := range ids {
		ts, err := c.getMany(ctx, []string{id})
		if skipped(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, ts...)
	}
	return out, nil
}
