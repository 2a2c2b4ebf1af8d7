package due

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultBatch is how many due items one request moves when Index.Batch is
// zero.
const DefaultBatch = 64

// Key is the key of item name under prefix, due at at.
func Key(prefix string, at time.Time, name string) string {
	return fmt.Sprintf("%s%019d-%s", prefix, at.UnixNano(), name)
}

// Bound is the first key under prefix of the items due at at: a range that
// ends there holds the items due before it.
func Bound(prefix string, at time.Time) string { return fmt.Sprintf("%s%019d", prefix, at.UnixNano()) }

// Parse reads a key of the index under prefix: the item's due time and
// name; false when key is not one.
func Parse(prefix, key string) (at time.Time, name string, ok bool) {
	rest, ok := strings.CutPrefix(key, prefix)
	if !ok || len(rest) < 21 || rest[19] != '-' {
		return time.Time{}, "", false
	}
	ns, err := strconv.ParseInt(rest[:19], 10, 64)
	if err != nil {
		return time.Time{}, "", false
	}
	return time.Unix(0, ns), rest[20:], true
}

// Index is one index of due items and what moving one does. Its fields are
// set before the first call and not changed after.
type Index struct {
	Client *clientv3.Client
	// Prefix is the index's prefix, ending in "/".
	Prefix string
	// Move returns the writes that move the due item kv (its key's
	// deletion is added). ok false drops the item: its key is deleted
	// and nothing else written (an unreadable value).
	Move func(kv *mvccpb.KeyValue) (ops []clientv3.Op, ok bool)
	// Shared, if set, returns writes made once per request, whatever
	// items of kvs it moves (markers that wake claimers, say).
	Shared func(kvs []*mvccpb.KeyValue) []clientv3.Op
	// Batch is how many items one request moves (0: DefaultBatch).
	Batch int
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// OnMoved, if set, is called with the items a request moved.
	OnMoved func(kvs []*mvccpb.KeyValue)
}

func (ix *Index) now() time.Time {
	if ix.Now != nil {
		return ix.Now()
	}
	return time.Now()
}

// Promote moves every item due by now and returns when the next falls due
// (zero: none is waiting) and how many items this call moved (others may
// have moved some of those it read). Each request reads up to Batch due
// items and moves them in one transaction of nested transactions, one per
// item, each conditional on the item's key being as read.
func (ix *Index) Promote(ctx context.Context) (next time.Time, moved int, err error) {
	batch := ix.Batch
	if batch <= 0 {
		batch = DefaultBatch
	}
	for {
		end := Bound(ix.Prefix, ix.now().Add(time.Nanosecond))
		g, err := ix.Client.Get(ctx, ix.Prefix, clientv3.WithRange(end), clientv3.WithLimit(int64(batch)))
		if err != nil {
			return time.Time{}, moved, fmt.Errorf("due: read %s: %w", ix.Prefix, err)
		}
		if len(g.Kvs) > 0 {
			n, err := ix.move(ctx, g.Kvs)
			moved += n
			if err != nil {
				return time.Time{}, moved, err
			}
			if g.More {
				continue
			}
		}
		first, err := ix.Client.Get(ctx, ix.Prefix, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil {
			return time.Time{}, moved, fmt.Errorf("due: read %s: %w", ix.Prefix, err)
		}
		if len(first.Kvs) == 0 {
			return time.Time{}, moved, nil
		}
		at, _, ok := Parse(ix.Prefix, string(first.Kvs[0].Key))
		if !ok {
			// Not an item's key: drop it, or it would stand first
			// for ever.
			if _, err := ix.Client.Delete(ctx, string(first.Kvs[0].Key)); err != nil {
				return time.Time{}, moved, fmt.Errorf("due: drop %s: %w", first.Kvs[0].Key, err)
			}
			continue
		}
		if !at.After(ix.now()) {
			continue // fell due meanwhile
		}
		return at, moved, nil
	}
}

// move moves the items kvs in one request and returns how many it moved.
func (ix *Index) move(ctx context.Context, kvs []*mvccpb.KeyValue) (int, error) {
	ops := make([]clientv3.Op, 0, len(kvs)+1)
	for _, kv := range kvs {
		key := string(kv.Key)
		writes, ok := ix.Move(kv)
		if !ok {
			writes = nil
		}
		then := append([]clientv3.Op{clientv3.OpDelete(key)}, writes...)
		ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)}, then, nil))
	}
	if ix.Shared != nil {
		ops = append(ops, ix.Shared(kvs)...)
	}
	resp, err := ix.Client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		return 0, fmt.Errorf("due: move items of %s: %w", ix.Prefix, err)
	}
	var won []*mvccpb.KeyValue
	for i, kv := range kvs {
		if resp.Responses[i].GetResponseTxn().GetSucceeded() {
			won = append(won, kv)
		}
	}
	if ix.OnMoved != nil && len(won) > 0 {
		ix.OnMoved(won)
	}
	return len(won), nil
}

// Run moves items as they fall due until ctx ends: one watch of the
// prefix (puts only) and one timer. After an error it waits a moment and
// starts again (a new watch, a new read), so an outage delays items but
// loses none.
func (ix *Index) Run(ctx context.Context) {
	for ctx.Err() == nil {
		ix.runOnce(ctx)
		sleep(ctx, 100*time.Millisecond+time.Duration(rand.Int64N(int64(100*time.Millisecond))))
	}
}

// runOnce runs one watch until it fails or ctx ends.
func (ix *Index) runOnce(ctx context.Context) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := ix.Client.Watch(clientv3.WithRequireLeader(wctx), ix.Prefix, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if !ok || wr.Err() != nil {
			return
		}
	case <-ctx.Done():
		return
	}
	for ctx.Err() == nil {
		next, _, err := ix.Promote(wctx)
		if err != nil {
			return
		}
		var fire <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(next.Sub(ix.now()))
			fire = timer.C
		}
	wait:
		select {
		case <-fire:
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				if timer != nil {
					timer.Stop()
				}
				return
			}
			if !earlier(ix.Prefix, wr.Events, next) {
				goto wait // an item due after the next: the timer stands
			}
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
	}
}

// earlier reports whether one of events puts an item due before next (or
// next is zero).
func earlier(prefix string, events []*clientv3.Event, next time.Time) bool {
	for _, ev := range events {
		at, _, ok := Parse(prefix, string(ev.Kv.Key))
		if !ok || next.IsZero() || at.Before(next) {
			return true
		}
	}
	return false
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
