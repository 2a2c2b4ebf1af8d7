package due

import (
	"cmp"
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// moveRead moves kvs, the items a read found, in batches (moveBatches),
// and sets start to where the next read begins: after them, or at the
// first batch another mover moved some of (again: read it at once,
// after a pause of rereadJitter). skipped is set, if empty, to the first
// item of the first batch another mover had the turn of.
func (ix *Index) moveRead(ctx context.Context, kvs []*mvccpb.KeyValue, batch int, start, skipped *string) (moved int, again bool, err error) {
	n, lost, other, err := ix.moveBatches(ctx, kvs, batch)
	if err != nil {
		return n, false, err
	}
	if other != "" && *skipped == "" {
		*skipped = other
	}
	if lost >= 0 { // another moved some: the rest again, after a pause
		if lost > 0 {
			*start = string(kvs[lost-1].Key) + "\x00" // the batches before it moved
		}
		sleep(ctx, time.Duration(rand.Int64N(int64(rereadJitter))))
		return n, true, ctx.Err()
	}
	// Read on after the batch, not from start again: the items it moved
	// stay in etcd's index as deleted keys until compaction, and a range
	// counts them, so reading from start at every batch made a backlog of
	// due items cost the square of its length. An item of the batch
	// another process changed meanwhile (a schedule's mover puts it
	// again) is a put the watch shows, or, for a caller without one,
	// within the margin it reads back.
	*start = string(kvs[len(kvs)-1].Key) + "\x00"
	return n, false, nil
}

// moveBatches moves kvs, one read's items in due order, in requests of
// batch items each, side by side, and returns how many it moved and
// where the first batch another process moved some of begins (its index
// in kvs; -1 for none): the caller reads on from there. The batches
// after a lost one may have moved; read again, they are not found.
func (ix *Index) moveBatches(ctx context.Context, kvs []*mvccpb.KeyValue, batch int) (moved, lost int, other string, err error) {
	batches := make([][]*mvccpb.KeyValue, 0, (len(kvs)+batch-1)/batch)
	for from := 0; from < len(kvs); from += batch {
		batches = append(batches, kvs[from:min(from+batch, len(kvs))])
	}
	turns, err := ix.takeTurns(ctx, batches)
	if err != nil {
		return 0, -1, "", err
	}
	type result struct {
		n      int
		reread bool
		err    error
	}
	results := make([]result, len(batches))
	var wg sync.WaitGroup
	for i, b := range batches {
		if turns != nil && turns[i].key == "" {
			if other == "" {
				other = string(b[0].Key)
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := &results[i]
			r.n, r.reread, r.err = ix.move(ctx, b, turnOf(turns, i))
		}()
	}
	wg.Wait()
	lost = -1
	for i, r := range results {
		moved += r.n
		err = cmp.Or(err, r.err)
		if (r.reread || r.err != nil) && lost < 0 {
			lost = i * batch
		}
	}
	return moved, lost, other, err
}

// pack puts ops into nested transactions of equal size for a request
// whose level holds nlevel compares (or reads in its other branch) and
// nshared operations of its own beside them, within maxTxnOps: the level
// holds the larger of its compares and operations, each nested one at
// most what that leaves. false: they do not fit.
func pack(ops []clientv3.Op, nlevel, nshared int) ([]clientv3.Op, bool) {
	for size := maxTxnOps - max(nlevel, nshared+1); size > 0; size-- {
		groups := (len(ops) + size - 1) / size
		if max(nlevel, groups+nshared)+size > maxTxnOps {
			continue
		}
		out := make([]clientv3.Op, 0, groups)
		for from := 0; from < len(ops); from += size {
			out = append(out, clientv3.OpTxn(nil, ops[from:min(from+size, len(ops))], nil))
		}
		return out, true
	}
	return nil, false
}
