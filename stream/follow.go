package stream

import (
	"context"
	"fmt"
	"iter"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Follow returns task id's stream from sequence number from on (1 or
// less: from its first event): the events stored, then those written
// as they come, through the hub's one watch of the stream. It may start
// before the task starts (it waits for the first event) or after it
// ended (within its retention), and gives the same sequence either way,
// each event once and in order. It ends after a Done event that is
// the stream's last, when ctx ends, or with an error (yielded); with
// WhenEnded, also when the task ended and nothing more is stored.
func (h *Hub) Follow(ctx context.Context, id string, from int64, opts ...FollowOption) iter.Seq2[Event, error] {
	var cfg followConfig
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.settle == 0 {
		cfg.settle = EndedSettle
	}
	return func(yield func(Event, error) bool) {
		next := max(from, 1)
		var seen endSeen
		for {
			s, leave, err := h.subscribe(ctx, id)
			if err != nil {
				if ctx.Err() == nil {
					yield(Event{}, err)
				}
				return
			}
			stop, again := h.follow(ctx, id, s, &next, cfg, &seen, yield)
			leave()
			if stop || !again {
				return
			}
		}
	}
}

// follow gives the follower the stored events from *next on, then the
// feed's; again: the feed closed or skipped, read from etcd again.
func (h *Hub) follow(ctx context.Context, id string, s *sub, next *int64, cfg followConfig, seen *endSeen, yield func(Event, error) bool) (stop, again bool) {
	var failed error
	give := func(list []Event) (stop, gap bool) {
		for _, ev := range list {
			switch {
			case ev.Seq < *next:
				continue
			case ev.Seq > *next:
				return false, true
			}
			*next = ev.Seq + 1
			if !yield(ev, nil) {
				return true, false
			}
			if ev.Type == Done && ev.Seq == list[len(list)-1].Seq {
				// Final only if nothing is stored after it.
				last, err := h.LastSeq(ctx, id)
				if err != nil {
					failed = err
					return true, false
				}
				if last <= ev.Seq {
					return true, false
				}
			}
		}
		return false, false
	}
	err := h.Read(ctx, id, *next, func(list []Event) bool {
		stop, _ = give(list)
		return !stop
	})
	if err == nil {
		err = failed
	}
	if err != nil {
		if ctx.Err() == nil {
			yield(Event{}, err)
		}
		return true, false
	}
	if stop {
		return true, false
	}
	end := endWatch{h: h, id: id, cfg: cfg, seen: seen}
	defer end.stop()
	if cfg.ended != nil && end.start(ctx, *next) {
		return true, false
	}
	for {
		select {
		case <-ctx.Done():
			return true, false
		case <-end.idle:
			if end.ended(ctx, *next) {
				return true, false
			}
		case <-end.settled:
			if end.ended(ctx, *next) {
				return true, false
			}
		case list, ok := <-s.ch:
			if !ok {
				return false, true
			}
			stop, gap := give(list)
			if failed != nil {
				if ctx.Err() == nil {
					yield(Event{}, failed)
				}
				return true, false
			}
			if stop || gap {
				return stop, gap
			}
		}
	}
}

// FollowOption configures Follow.
type FollowOption func(*followConfig)

type followConfig struct {
	ended  func(context.Context) (time.Time, bool)
	every  time.Duration
	settle time.Duration // 0: EndedSettle
}

// DefaultEndedCheck is how often an idle follower with WhenEnded asks
// whether its task ended.
const DefaultEndedCheck = 5 * time.Second

// endWriteTimeout is how long a write of an attempt's end or a stream's
// Done waits for its answer.
const endWriteTimeout = 10 * time.Second

// EndedSettle is how long a follower with WhenEnded waits, after its
// task's end, for a Done that may still be on its way, when it found the
// task ended with events stored and no Done: a task's Done is written
// after its outcome is stored (Finish), so a follower may find the task
// ended in between. It is the time a Done write waits for its answer
// (one that waits longer, behind a congested writer, may still come
// later: the follower has ended by then, without it).
const EndedSettle = endWriteTimeout

// WhenEnded makes Follow end when its task ended (ended says so: the
// package of the task's kind knows, this one does not) and nothing is
// stored past the events given: a task that ended without a Done (a
// cancel, a worker gone between its outcome and its Done) ends its
// followers too. It is asked once the stored events are given, then
// every interval (0: DefaultEndedCheck) while no event comes. A stream
// with events ends so only once the task was found ended, with nothing
// more stored, at two checks at least EndedSettle apart (the second is
// made when that time is over, whatever the interval): the Done that
// follows a stored outcome is not lost to a follower that looked in
// between (a stream without events gets no Done, and ends at once).
func WhenEnded(ended func(context.Context) bool, every time.Duration) FollowOption {
	return WhenEndedAt(func(ctx context.Context) (time.Time, bool) { return time.Time{}, ended(ctx) }, every)
}

// WhenEndedAt is WhenEnded for a task whose end's time is known: ended
// also says when the task's outcome was stored (zero: not known). The
// follower then waits for a late Done only until EndedSettle after that
// time (never longer than EndedSettle from its first check): the
// follower of a task that ended long ago without a Done ends at once.
// That time is of the clock of whoever stored the outcome, read against
// this one's: a clock ahead of it by EndedSettle or more may end a
// follower before a late Done, as WhenEnded never does.
func WhenEndedAt(ended func(context.Context) (time.Time, bool), every time.Duration) FollowOption {
	if every <= 0 {
		every = DefaultEndedCheck
	}
	return func(c *followConfig) { c.ended, c.every = ended, every }
}

// SettleAfter replaces EndedSettle for a follower with WhenEnded (at
// most the wait for a Done written after its task's outcome: shorter, and
// the follower may end without a Done that was on its way).
func SettleAfter(d time.Duration) FollowOption {
	return func(c *followConfig) { c.settle = max(d, time.Nanosecond) }
}

// endSeen is when a follower first found its task ended with nothing
// more stored, its next event then, and how long it waits from then for
// a late Done.
type endSeen struct {
	at   time.Time
	wait time.Duration
	next int64
}

// endWatch is a follower's checks of its task's end (WhenEnded): every
// interval while idle (idle), and once a wait for a late Done is over
// (settled); both nil until start.
type endWatch struct {
	h             *Hub
	id            string
	cfg           followConfig
	seen          *endSeen
	idle, settled <-chan time.Time
	tick          *time.Ticker
	timer         *time.Timer
}

// start makes the first check, and says whether the follower ends;
// otherwise the checks every interval start.
func (w *endWatch) start(ctx context.Context, next int64) bool {
	if w.ended(ctx, next) {
		return true
	}
	w.tick = time.NewTicker(w.cfg.every)
	w.idle = w.tick.C
	return false
}

// ended says whether the follower ends (endedIdle), and sets settled to
// fire when a wait for a late Done under way is over.
func (w *endWatch) ended(ctx context.Context, next int64) bool {
	w.settled = nil
	end, wait := w.h.endedIdle(ctx, w.id, next, w.cfg, w.seen)
	if wait > 0 {
		if w.timer == nil {
			w.timer = time.NewTimer(wait)
		} else {
			w.timer.Reset(wait)
		}
		w.settled = w.timer.C
	}
	return end
}

// stop stops the watch's ticker and timer.
func (w *endWatch) stop() {
	if w.tick != nil {
		w.tick.Stop()
	}
	if w.timer != nil {
		w.timer.Stop()
	}
}

// endedIdle says whether the follower's task ended and nothing is
// stored from next on: at once for a stream without events, otherwise
// only when it was so at a check made once the wait for a late Done
// that began at the first such check is over (monotonic time: a jump of
// the wall clock does not shorten it). Otherwise wait, when not 0, is
// how long that wait still takes.
func (h *Hub) endedIdle(ctx context.Context, id string, next int64, cfg followConfig, seen *endSeen) (ended bool, wait time.Duration) {
	if seen.next != next {
		seen.at, seen.wait, seen.next = time.Time{}, 0, 0 // events came since: the wait starts again
	}
	if !seen.at.IsZero() {
		if left := seen.wait - time.Since(seen.at); left > 0 {
			return false, left
		}
	}
	at, ok := cfg.ended(ctx)
	if !ok {
		seen.at, seen.wait, seen.next = time.Time{}, 0, 0
		return false, 0
	}
	last, err := h.LastSeq(ctx, id)
	if err != nil || last >= next {
		return false, 0
	}
	if last == 0 || !seen.at.IsZero() {
		return true, 0
	}
	wait = cfg.settle
	if !at.IsZero() {
		wait = min(wait, time.Until(at.Add(cfg.settle)))
	}
	if wait <= 0 {
		return true, 0 // it ended long enough ago for its Done to be stored
	}
	seen.at, seen.wait, seen.next = time.Now(), wait, next
	return false, wait
}

// LastSeq returns the sequence number of the last event stored of task
// id's stream, 0 if it has none.
func (h *Hub) LastSeq(ctx context.Context, id string) (int64, error) {
	resp, err := h.cli.Get(ctx, h.keys.StreamChunks(id), clientv3.WithPrefix(),
		clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return 0, fmt.Errorf("stream: read task %s's last event: %w", id, err)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	c, err := decodeChunk(resp.Kvs[0].Key, resp.Kvs[0].Value)
	if err != nil || len(c.List) == 0 {
		return 0, fmt.Errorf("stream: task %s: %w", id, err)
	}
	return c.List[len(c.List)-1].Seq, nil
}

// Read calls each with the stored events of task id's stream from
// sequence number from on, a chunk at a time (a chunk may begin before
// from), until each returns false.
func (h *Hub) Read(ctx context.Context, id string, from int64, each func([]Event) bool) error {
	prefix := h.keys.StreamChunks(id)
	// The chunk that holds from is the last that starts at or before it.
	start := prefix
	if from > 1 {
		resp, err := h.cli.Get(ctx, prefix, clientv3.WithRange(h.keys.StreamChunkStart(id, from+1)),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil {
			return fmt.Errorf("stream: read task %s's stream: %w", id, err)
		}
		if len(resp.Kvs) > 0 {
			start = string(resp.Kvs[0].Key)
		}
	}
	end := clientv3.GetPrefixRangeEnd(prefix)
	for {
		resp, err := h.cli.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(64))
		if err != nil {
			return fmt.Errorf("stream: read task %s's stream: %w", id, err)
		}
		for _, kv := range resp.Kvs {
			c, err := decodeChunk(kv.Key, kv.Value)
			if err != nil {
				return err
			}
			if !each(c.List) {
				return nil
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}
