package stream

import (
	"context"
	"fmt"
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A stream is removed by its expiry keys, not by an etcd lease: a lease
// cannot be given to keys already written without writing them again,
// and a stream's end is only known at its end. So its first chunk
// writes an expiry key at MaxAge, its Done another at Retention, and
// any process's Writer sweeps the keys that fell due (Expire), at most
// once per sweepEvery, after a transaction of its own, until none is
// due or its time budget is spent: the work is range reads of the due
// keys, and the streams found.

// sweepEvery is how often a Writer sweeps expired streams.
const sweepEvery = time.Minute

// maybeSweep starts a sweep in the background when the last is
// sweepEvery old.
func (w *Writer) maybeSweep() {
	w.paceMu.Lock()
	now := w.now()
	if now.Sub(w.lastSweep) < sweepEvery {
		w.paceMu.Unlock()
		return
	}
	w.lastSweep = now
	w.paceMu.Unlock()
	w.forget()
	w.crew.goesIfOpen(func() {
		ctx, cancel := context.WithTimeout(w.ctx, 30*time.Second)
		defer cancel()
		defer context.AfterFunc(w.cli.Ctx(), cancel)() // the client closed: no sweep
		_, _ = w.Expire(ctx)
	})
}

// Expire removes the streams whose expiry fell due: a stream whose task
// ended Retention ago, or that has had no event for MaxAge. It goes on
// until none is due or ctx ends (its time budget), and returns how many
// it removed.
func (w *Writer) Expire(ctx context.Context) (int, error) {
	now := w.now()
	prefix := w.keys.StreamExpiries()
	start, end := prefix, keyspace.TimeBound(prefix, now.UnixNano())
	removed := 0
	for {
		resp, err := w.cli.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(100))
		if err != nil {
			return removed, fmt.Errorf("stream: read the due expiries: %w", err)
		}
		for _, kv := range resp.Kvs {
			_, id, ok := keyspace.ParseTimedKey(prefix, string(kv.Key))
			if !ok {
				continue
			}
			gone, err := w.expire(ctx, id, string(kv.Key), now)
			if err != nil {
				return removed, err
			}
			if gone {
				removed++
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return removed, nil
		}
		start = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00" // one kept (written to since) is not read again
	}
}

// expire removes task id's stream if it is past its retention, and its
// expiry key key in any case; a stream still in use gets a later one.
func (w *Writer) expire(ctx context.Context, id, key string, now time.Time) (bool, error) {
	chunks := w.keys.StreamChunks(id)
	resp, err := w.cli.Get(ctx, chunks, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend), clientv3.WithLimit(1))
	if err != nil {
		return false, fmt.Errorf("stream: read task %s's stream: %w", id, err)
	}
	ops := []clientv3.Op{clientv3.OpDelete(key)}
	remove := false
	if len(resp.Kvs) > 0 {
		c, err := decodeChunk(resp.Kvs[0].Key, resp.Kvs[0].Value)
		if err != nil || len(c.List) == 0 {
			remove = true // unreadable: nothing can follow it
		} else {
			last := c.List[len(c.List)-1]
			switch {
			case last.Type == Done && now.Sub(last.Time) >= w.lim.Retention,
				last.Type != Done && now.Sub(last.Time) >= w.lim.MaxAge:
				remove = true
			case last.Type != Done: // in use: due again MaxAge after its last event
				ops = append(ops, clientv3.OpPut(keyspace.TimedKey(w.keys.StreamExpiries(), last.Time.Add(w.lim.MaxAge).UnixNano(), id), ""))
			}
		}
	}
	if remove {
		ops = append(ops, clientv3.OpDelete(chunks, clientv3.WithPrefix()))
	}
	// Nothing written to the stream since it was read.
	unchanged := clientv3.Compare(clientv3.ModRevision(chunks).WithPrefix(), "<", resp.Header.Revision+1)
	done, err := w.cli.Txn(ctx).If(unchanged).Then(ops...).Commit()
	if err != nil {
		return false, fmt.Errorf("stream: remove task %s's stream: %w", id, err)
	}
	return remove && done.Succeeded, nil // written to meanwhile: not removed
}
