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
	var idle <-chan time.Time
	if cfg.ended != nil {
		if h.endedIdle(ctx, id, *next, cfg, seen) {
			return true, false
		}
		t := time.NewTicker(cfg.every)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return true, false
		case <-idle:
			if h.endedIdle(ctx, id, *next, cfg, seen) {
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
	ended  func(context.Context) bool
	every  time.Duration
	settle time.Duration // 0: EndedSettle
}

// DefaultEndedCheck is how often an idle follower with WhenEnded asks
// whether its task ended.
const DefaultEndedCheck = 5 * time.Second

// endWriteTimeout bounds a write of an attempt's end or a stream's Done:
// a Done not stored this long after its write began never will be.
const endWriteTimeout = 10 * time.Second

// EndedSettle is how long a follower with WhenEnded waits, after it
// first found its task ended with events stored and no Done, for a Done
// that may still be on its way: a task's Done is written after its
// outcome is stored (Finish), so a follower may find the task ended in
// between. It is the bound of that write.
const EndedSettle = endWriteTimeout

// WhenEnded makes Follow end when its task ended (ended says so: the
// package of the task's kind knows, this one does not) and nothing is
// stored past the events given: a task that ended without a Done (a
// cancel, a worker gone between its outcome and its Done) ends its
// followers too. It is asked once the stored events are given, then
// every interval (0: DefaultEndedCheck) while no event comes. A stream
// with events ends so only once the task was found ended, with nothing
// more stored, at two checks at least EndedSettle apart: the Done that
// follows a stored outcome is not lost to a follower that looked in
// between (a stream without events gets no Done, and ends at once).
func WhenEnded(ended func(context.Context) bool, every time.Duration) FollowOption {
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
// more stored, and its next event then.
type endSeen struct {
	at   time.Time
	next int64
}

// endedIdle says whether the follower's task ended and nothing is
// stored from next on: at once for a stream without events, otherwise
// only when it was so at a check at least cfg.settle before with the
// same next.
func (h *Hub) endedIdle(ctx context.Context, id string, next int64, cfg followConfig, seen *endSeen) bool {
	if seen.next != next {
		*seen = endSeen{} // events came since: the wait starts again
	}
	if !seen.at.IsZero() && time.Since(seen.at) < cfg.settle {
		return false
	}
	if !cfg.ended(ctx) {
		*seen = endSeen{}
		return false
	}
	last, err := h.LastSeq(ctx, id)
	if err != nil || last >= next {
		return false
	}
	if last == 0 || !seen.at.IsZero() {
		return true
	}
	*seen = endSeen{at: time.Now(), next: next}
	return false
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
