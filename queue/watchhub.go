package queue

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Client keeps one etcd watch per queue for all the waits of its claims
// (a Worker's claim loop waiting for work, and each external claim leading
// its line, broker.go), opened by the first wait and kept while waits
// come, instead of a watch of its own for each wait.
//
// The reason is latency, not only the cost of opening watches: a wait
// must see everything after the revision its claim read, so its own watch
// had to start at that revision, and etcd serves a watch that starts at a
// past revision from its "unsynced" set, which it catches up every 100 ms.
// Under load the store has always moved past the claim's read by the time
// the watch opens, so a wait learned of a new task up to 100 ms late:
// measured, the HTTP long polls' p99 from submission to claim was 92-98 ms
// with a watch per wait and 23 ms with watches that start at the current
// revision (docs/bench-log/http-api.md). The shared watch starts at the current
// revision, so etcd sends its events as they commit, and keeps the last
// watchHistory events (keys and revisions, no values) so that a wait that
// starts after events it must see replays them; a wait whose revision is
// older than that history, or than the watch, is woken at once to claim
// again (it may have missed something): more than 4,096 events of the
// queue between a claim's read and its wait cost one more claim.

// watchHistory is how many of a queue's latest events its shared watch
// keeps for waits that start after them.
const watchHistory = 4096

// watchLinger is how long a queue's shared watch stays open after its
// last wait ended, for the next.
const watchLinger = 10 * time.Second

// watchHub is a Client's shared watches, per queue. The zero value is
// ready.
type watchHub struct {
	mu      sync.Mutex
	queues  map[string]*queueWatch
	closed  bool           // Client.Close: no watch opens from now on
	running sync.WaitGroup // the watches' goroutines (runWatch)
	live    atomic.Int64   // how many of them have not returned from runWatch
	// lingerFor replaces watchLinger when not 0 (tests: SetWatchLinger).
	lingerFor time.Duration
}

// queueWatch is the shared watch of one queue. Every field is guarded by
// mu.
type queueWatch struct {
	mu sync.Mutex
	// open: the watch is open and has sent every event up to seen; hist
	// holds those after histFrom (at least the last watchHistory).
	open           bool
	histFrom, seen int64
	hist           []*clientv3.Event
	waits          map[*queueWait]struct{}
	linger         *time.Timer
	stop           context.CancelFunc
}

// queueWait is one wait's view of its queue's shared watch: the events
// after its revision, or missed when some could not be given to it.
type queueWait struct {
	qw      *queueWatch
	hub     *watchHub
	q       string
	after   int64 // the revision its claim read; 0: from when it started
	pending []*clientv3.Event
	missed  bool
	signal  chan struct{} // holds a token when pending or missed changed
}

// waitAfter starts a wait for the events of queue q after revision rev.
// With rev 0 (the claim's read revision is unknown) it sees the events
// from about when it starts: those etcd had not yet sent at the revision
// of the watch's last answer may be skipped. The caller must call Stop
// once it stops waiting.
func (c *Client) waitAfter(q string, rev int64) *queueWait {
	h := &c.watches
	h.mu.Lock() // until qw.mu is held: the linger must not close a watch being joined
	if h.closed {
		// The Client is closed: a wait that no watch serves, ended by
		// its caller's timer.
		h.mu.Unlock()
		return &queueWait{qw: &queueWatch{waits: map[*queueWait]struct{}{}}, hub: h, q: q, after: rev, signal: make(chan struct{}, 1)}
	}
	if h.queues == nil {
		h.queues = map[string]*queueWatch{}
	}
	qw := h.queues[q]
	if qw == nil {
		ctx, cancel := context.WithCancel(c.cli.Ctx())
		qw = &queueWatch{waits: map[*queueWait]struct{}{}, stop: cancel}
		h.queues[q] = qw
		h.running.Add(1)
		h.live.Add(1)
		go func() {
			defer h.running.Done()
			c.runWatch(ctx, h, q, qw)
			h.live.Add(-1)
		}()
	}
	wt := &queueWait{qw: qw, hub: h, q: q, after: rev, signal: make(chan struct{}, 1)}
	qw.mu.Lock()
	h.mu.Unlock() // the history's replay below holds up no other queue's waits
	defer qw.mu.Unlock()
	if qw.linger != nil {
		qw.linger.Stop()
		qw.linger = nil
	}
	qw.waits[wt] = struct{}{}
	if !qw.open {
		return wt // judged when the watch opens
	}
	if wt.after == 0 {
		wt.after = qw.seen
	}
	if wt.after < qw.histFrom {
		wt.miss()
		return wt
	}
	wt.add(qw.hist)
	return wt
}

// C is signalled when Take has something for the wait.
func (wt *queueWait) C() <-chan struct{} { return wt.signal }

// Take returns the events the wait got since the last Take, and whether
// it missed some (then it must claim again).
func (wt *queueWait) Take() (events []*clientv3.Event, missed bool) {
	events, missed, _ = wt.takeSeen()
	return events, missed
}

// takeSeen is Take, and also the revision up to which the wait has been
// given every event of its queue (0: not known): the watch's.
func (wt *queueWait) takeSeen() (events []*clientv3.Event, missed bool, seen int64) {
	wt.qw.mu.Lock()
	defer wt.qw.mu.Unlock()
	events, wt.pending = wt.pending, nil
	if wt.qw.open {
		seen = wt.qw.seen
	}
	return events, wt.missed, seen
}

// Stop ends the wait. When it was the queue's last, the watch closes a
// while later unless another wait starts.
func (wt *queueWait) Stop() {
	qw := wt.qw
	qw.mu.Lock()
	defer qw.mu.Unlock()
	if _, ok := qw.waits[wt]; !ok {
		return
	}
	delete(qw.waits, wt)
	if len(qw.waits) == 0 && qw.linger == nil {
		d := watchLinger
		if wt.hub.lingerFor > 0 {
			d = wt.hub.lingerFor
		}
		qw.linger = time.AfterFunc(d, func() { wt.hub.close(wt.q, qw) })
	}
}

// close ends queue q's shared watch qw if no wait started since its last
// ended.
func (h *watchHub) close(q string, qw *queueWatch) {
	h.mu.Lock()
	defer h.mu.Unlock()
	qw.mu.Lock()
	defer qw.mu.Unlock()
	if len(qw.waits) > 0 || h.queues[q] != qw {
		return
	}
	delete(h.queues, q)
	qw.stop()
}

// shut stops every watch of the hub, and any from opening, and waits until
// their goroutines have returned or ctx ends.
func (h *watchHub) shut(ctx context.Context) error {
	h.mu.Lock()
	h.closed = true
	for _, qw := range h.queues {
		qw.mu.Lock()
		if qw.linger != nil {
			qw.linger.Stop()
			qw.linger = nil
		}
		qw.mu.Unlock()
		qw.stop() // runWatch removes it from queues as it returns
	}
	h.mu.Unlock()
	done := make(chan struct{})
	go func() {
		h.running.Wait()
		close(done)
	}()
	if h.live.Load() == 0 { // stopped already: an ended ctx changes nothing
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("queue: close: the watches did not stop: %w", ctx.Err())
	}
}

// add gives the wait the events of evs after its revision. qw.mu is held.
func (wt *queueWait) add(evs []*clientv3.Event) {
	n := len(wt.pending)
	for _, ev := range evs {
		if ev.Kv.ModRevision > wt.after {
			wt.pending = append(wt.pending, ev)
		}
	}
	if len(wt.pending) > watchHistory {
		wt.pending = nil // a wait that takes nothing for that long claims again
		wt.miss()
		return
	}
	if len(wt.pending) > n {
		wt.notify()
	}
}

// miss marks that the wait may have missed events. qw.mu is held.
func (wt *queueWait) miss() {
	wt.missed = true
	wt.notify()
}

func (wt *queueWait) notify() {
	select {
	case wt.signal <- struct{}{}:
	default:
	}
}

// runWatch keeps queue q's shared watch qw open until ctx ends (the hub
// closed it, or the etcd client closed), opening it again after an error;
// every wait is woken (as having missed events) when it closes.
func (c *Client) runWatch(ctx context.Context, h *watchHub, q string, qw *queueWatch) {
	defer func() {
		h.mu.Lock()
		if h.queues[q] == qw {
			delete(h.queues, q) // the etcd client closed: a next wait opens another
		}
		h.mu.Unlock()
		qw.reset()
	}()
	backoff := 50 * time.Millisecond
	for ctx.Err() == nil {
		wch := c.cli.Watch(clientv3.WithRequireLeader(ctx), c.keys.Queue(q), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		var err error
		for wr := range wch {
			if err = wr.Err(); err != nil {
				break
			}
			if wr.Created {
				qw.opened(wr.Header.Revision)
				backoff = 50 * time.Millisecond
				continue
			}
			qw.deliver(wr.Events, wr.Header.Revision)
		}
		qw.reset()
		if ctx.Err() != nil {
			return
		}
		// The waits were woken to claim again; the watch opens again
		// after a pause that grows while it keeps failing.
		slog.Warn("queue: the watch of a queue's keys ended; opening it again", "queue", q, "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// opened records that the watch sends every event after rev, and wakes
// the waits whose revision is older: what came between is not known.
func (qw *queueWatch) opened(rev int64) {
	qw.mu.Lock()
	defer qw.mu.Unlock()
	qw.open, qw.histFrom, qw.seen, qw.hist = true, rev, rev, nil
	for wt := range qw.waits {
		if wt.after == 0 {
			wt.after = rev
		}
		if wt.after < rev {
			wt.miss()
		}
	}
}

// deliver keeps evs (without their values) in the history and gives them
// to the waits; rev is the revision the watch has sent every event up to.
func (qw *queueWatch) deliver(evs []*clientv3.Event, rev int64) {
	light := make([]*clientv3.Event, len(evs))
	for i, ev := range evs {
		light[i] = &clientv3.Event{Type: ev.Type, Kv: &mvccpb.KeyValue{
			Key: ev.Kv.Key, CreateRevision: ev.Kv.CreateRevision, ModRevision: ev.Kv.ModRevision,
		}}
	}
	qw.mu.Lock()
	defer qw.mu.Unlock()
	qw.seen = max(qw.seen, rev)
	qw.hist = append(qw.hist, light...)
	if over := len(qw.hist) - watchHistory; over > watchHistory {
		// Drop the oldest, down to watchHistory, whole revisions at a
		// time (a transaction's events together), and say from where the
		// history is complete.
		cut := qw.hist[over-1].Kv.ModRevision
		for over < len(qw.hist) && qw.hist[over].Kv.ModRevision == cut {
			over++
		}
		qw.histFrom = cut
		qw.hist = append([]*clientv3.Event(nil), qw.hist[over:]...)
	}
	for wt := range qw.waits {
		wt.add(light)
	}
}

// reset marks the watch closed and wakes every wait: events may be lost
// until it opens again.
func (qw *queueWatch) reset() {
	qw.mu.Lock()
	defer qw.mu.Unlock()
	qw.open, qw.hist = false, nil
	for wt := range qw.waits {
		wt.miss()
	}
}

// claimWait is a claimer's wait for work after a claim that read the queue
// at revision read (0: not known), through the queue's shared watch.
//
// It also tells the open window (openWindow.created) of the segments
// opened since the claimer's last wait, before the claim's read: a read
// bounded by the window starts at its head, the oldest open segment an
// earlier read found, so a segment named before the head (named, then
// committed later: submissions made at once, one held up, or a
// submitter's clock behind) lies outside every such read, and the window
// learns of it only from its watch event. Events before the claim's read
// were given to no wait when the claim loops were claiming (or waiting
// for a free slot) as they came: a worker that then found nothing waited
// for its 30 s safety net while such a segment's tasks were pending. So
// a wait starts where the claimer's waits left off (noted) when that is
// before the claim's read; the events up to the read only tell the
// window, and one that puts the read in doubt makes the claim be made
// again.
type claimWait struct {
	*queueWait
	w    *claimer
	read int64
	// goesOn: the wait starts at or before noted, so the events it is given
	// carry noted on.
	goesOn bool
}

// waitAfterClaim starts a claimWait after a claim that read at rev. The
// caller must call Stop once it stops waiting.
func (w *claimer) waitAfterClaim(rev int64) *claimWait {
	cw := &claimWait{w: w, read: rev}
	from := rev
	if rev > 0 {
		// With noted not known (the first wait, or the first after a
		// missed one, whose claims read without a bound) the wait starts
		// at the read and noted from there.
		w.levelMu.Lock()
		if w.noted > 0 && w.noted < rev {
			from = w.noted
		}
		w.levelMu.Unlock()
		cw.goesOn = true
	}
	cw.queueWait = w.client.waitAfter(w.queue, from)
	return cw
}

// Take returns the events after the claim's read, and missed when the
// claim must be made again: the wait may have missed events (the next
// read then has no bound), or a segment opened before the read lies
// where the read did not look.
func (cw *claimWait) Take() (events []*clientv3.Event, missed bool) {
	evs, missed, seen := cw.takeSeen()
	w := cw.w
	w.levelMu.Lock()
	defer w.levelMu.Unlock()
	if missed {
		w.noted, w.window.known = 0, false
		w.windowGen++
		return nil, true
	}
	open := w.keys.SegmentsOpen(w.queue)
	for _, ev := range evs {
		if ev.Kv.ModRevision > cw.read {
			events = append(events, ev)
			continue
		}
		if seg, ok := keyspace.OpenSegmentName(open, string(ev.Kv.Key)); ok && ev.IsCreate() {
			missed = w.opened(seg, ev.Kv.ModRevision) || missed
		}
	}
	if cw.goesOn {
		w.noted = max(w.noted, seen)
	}
	return events, missed
}

// opened tells the window of segment seg, opened at revision rev (levelMu
// held), and reports whether that made the window unknown: the next read
// has no bound, and a read made before rev no longer adapts the window
// (sawOpen).
func (w *claimer) opened(seg string, rev int64) bool {
	// Whatever it does to the window, a read from before rev did not see
	// seg, so it must not move the head (sawOpen): past seg, when seg
	// lies after the head now, a segment this event told of would be
	// left behind the head until the next read without a bound.
	w.windowAt = max(w.windowAt, rev)
	if !w.window.known {
		return false
	}
	w.window.created(seg)
	if w.window.known {
		return false
	}
	w.windowGen++
	return true
}
