package queue

import (
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
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
		busySegs: map[string]time.Time{}, lostSegs: newOrphanList()}
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
