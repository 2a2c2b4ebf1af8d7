package stream

import (
	"context"
	"fmt"
	"iter"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Follow returns task id's stream from sequence number from on (1 or
// less: from its first event): the events stored, then those written
// as they come, through the hub's one watch of the stream. It may start
// before the task starts (it waits for the first event) or after it
// ended (within its retention), and gives the same sequence either way,
// each event once and in order. It ends after a Done event, when ctx
// ends, or with an error (yielded).
func (h *Hub) Follow(ctx context.Context, id string, from int64) iter.Seq2[Event, error] {
	return func(yield func(Event, error) bool) {
		next := max(from, 1)
		for {
			s, leave, err := h.subscribe(ctx, id)
			if err != nil {
				if ctx.Err() == nil {
					yield(Event{}, err)
				}
				return
			}
			stop, again := h.follow(ctx, id, s, &next, yield)
			leave()
			if stop || !again {
				return
			}
		}
	}
}

// follow gives the follower the stored events from *next on, then the
// feed's; again: the feed closed or skipped, read from etcd again.
func (h *Hub) follow(ctx context.Context, id string, s *sub, next *int64, yield func(Event, error) bool) (stop, again bool) {
	give := func(list []Event) (stop, gap bool) {
		for _, ev := range list {
			switch {
			case ev.Seq < *next:
				continue
			case ev.Seq > *next:
				return false, true
			}
			*next = ev.Seq + 1
			if !yield(ev, nil) || ev.Type == Done {
				return true, false
			}
		}
		return false, false
	}
	err := h.Read(ctx, id, *next, func(list []Event) bool {
		stop, _ = give(list)
		return !stop
	})
	if err != nil {
		if ctx.Err() == nil {
			yield(Event{}, err)
		}
		return true, false
	}
	if stop {
		return true, false
	}
	for {
		select {
		case <-ctx.Done():
			return true, false
		case list, ok := <-s.ch:
			if !ok {
				return false, true
			}
			stop, gap := give(list)
			if stop || gap {
				return stop, gap
			}
		}
	}
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
			c, err := decodeChunk(string(kv.Key), kv.Value)
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
