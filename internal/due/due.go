package due

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultBatch is how many due items one request moves when Index.Batch is
// zero.
const DefaultBatch = 64

// Key is the key of item name under prefix, due at at.
func Key(prefix string, at time.Time, name string) string {
	return keyspace.TimedKey(prefix, at.UnixNano(), name)
}

// Bound is the first key under prefix of the items due at at: a range that
// ends there holds the items due before it.
func Bound(prefix string, at time.Time) string { return keyspace.TimeBound(prefix, at.UnixNano()) }

// Parse reads a key of the index under prefix: the item's due time and
// name; false when key is not one.
func Parse(prefix, key string) (at time.Time, name string, ok bool) {
	ns, name, ok := keyspace.ParseTimedKey(prefix, key)
	if !ok {
		return time.Time{}, "", false
	}
	return time.Unix(0, ns), name, true
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
	// Gather, if set, moves the items of a request together rather than
	// one by one: it returns the compares its writes need (besides each
	// item's key being as read, which the index adds) and the writes
	// that move every item of kvs (the items' deletions are added), which
	// the index packs into nested transactions within etcd's operations
	// a request. The request is one transaction, so all of kvs move or
	// none: a move that fails, or whose compares do not hold, leaves
	// everything as it was, and the items then move one by one (Move).
	// ops nil: move them one by one at once.
	Gather func(ctx context.Context, kvs []*mvccpb.KeyValue) (cmps []clientv3.Cmp, ops []clientv3.Op, err error)
	// Linger, with Gather, is how long after the first of a read's items
	// fell due the index waits for more to fall due before it moves them,
	// when the read found fewer than a batch: items due within Linger of
	// each other move together, each at most Linger late for it. Items
	// due in a steady stream otherwise move as each falls due, a few at a
	// time, and there is little to gather.
	Linger time.Duration
	// Batch is how many items one request moves (0: DefaultBatch; at
	// most etcd's 128 operations a request).
	Batch int
	// Parallel is how many requests of Batch items each one read takes
	// and moves at once, when that many are due (0: one). The items of
	// one read are in due order and each request takes the next Batch of
	// them, so the requests' items are disjoint: their moves do not
	// refuse one another. A backlog then moves Parallel batches a round
	// trip (the range read, then the requests side by side), not one.
	// At most 127 (one turn request takes every batch's turn).
	Parallel int
	// Turns, if set, makes several movers of the index share a backlog
	// rather than race for it: before it moves the batches of a read, a
	// mover puts a key per batch under Turns (outside Prefix), named after
	// the batch's first item, if absent, and moves only the batches whose
	// keys it put or finds its own (the value is its id, Holder); it reads
	// the others again a moment later (turnWait, doubled while the same
	// batch stays held). The moves delete their keys (if they still hold
	// the mover's id), and each key is bound to a lease of the mover's own that lives
	// TurnTTL and is not kept alive, so a turn whose mover hangs or
	// stopped ends on its own. The keys order no move: each move still
	// compares its items as read.
	Turns string
	// TurnTTL is the life of a mover's turn lease (0: DefaultTurnTTL;
	// etcd raises it to its least, about 2 s). A mover grants a new lease
	// when the last has less than RequestTimeout and a second left, so a
	// TurnTTL shorter than that makes a grant at every read.
	TurnTTL time.Duration
	// RequestTimeout bounds each move (its Gather and its transaction)
	// and each turn request (0: DefaultRequestTimeout with Turns, else
	// none), so that a hung request holds no turn beyond it; a move under
	// a turn also ends a second before the turn's lease does.
	RequestTimeout time.Duration
	// Holder is the id the mover's turn keys carry ("": one made for the
	// index: host, process, a random part).
	Holder string
	// Now is the clock (nil: time.Now).
	Now func() time.Time
	// OnMoved, if set, is called with the items a request moved.
	OnMoved func(kvs []*mvccpb.KeyValue)
	// Name names the index in Run's logs and in the metric
	// drover_due_errors_total{index} ("" for "due").
	Name string
	// Logger receives Run's errors (nil: slog.Default()), at most one
	// line per errorLogEvery with the count of those left out.
	Logger *slog.Logger

	// Run's error log: when it last wrote, and the errors since.
	logged   time.Time
	unlogged int
	// pause is Run's sleep between tries (nil: sleep).
	pause func(ctx context.Context, d time.Duration)

	// The turns' holder id and lease (turns.go), and when that ends; the
	// first item of the batch last found held and the wait before its
	// read again (heldWait); when a failed grant was last logged.
	turnMu      sync.Mutex
	holder      string
	lease       clientv3.LeaseID
	leaseEnd    time.Time
	held        string
	heldFor     time.Duration
	grantLogged time.Time
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
	next, _, moved, err = ix.promote(ctx, time.Time{})
	return next, moved, err
}

// PromoteFrom is Promote for a caller that remembers where its last call
// left off and has no watch of the index (a server moving items within
// its claims): it reads from the items due at from on (zero: from the
// first) and returns done, the time up to which it moved every item, for
// the next call. etcd counts every key a range covers, the moved ones too
// until compaction, so a read from the index's start costs in proportion
// to what moved lately. An item put due before from (a put that raced the
// last call, a submitter whose clock is behind) is not read: such a
// caller reads back a margin, and from the first item now and then.
func (ix *Index) PromoteFrom(ctx context.Context, from time.Time) (next, done time.Time, moved int, err error) {
	return ix.promote(ctx, from)
}

// promote is Promote reading from the items due at from on (zero: from
// the first): etcd counts every key a range covers, the keys deleted since
// the last compaction too, so a reader that knows no item is due before
// from (Run, which sees every item put) starts there. done is the time up
// to which every item was moved: the next call's from.
func (ix *Index) promote(ctx context.Context, from time.Time) (next, done time.Time, moved int, err error) {
	batch := ix.batchSize()
	start := ix.Prefix
	if !from.IsZero() {
		start = Bound(ix.Prefix, from)
	}
	span := firstStep
	lingered := "" // the start of the last read that lingered
	skipped := ""  // the first item of the first batch another mover had the turn of
	for {
		now := ix.now()
		kvs, more, stepEnd, err := ix.readDue(ctx, start, now, span, batch*ix.parallel())
		if err != nil {
			return time.Time{}, from, moved, err
		}
		if wait := ix.lingerFor(kvs, more || stepEnd != "", now); wait > 0 && lingered != start {
			// Fewer than a batch, the first due a moment ago: let the
			// items due in the next moments join it (Linger).
			lingered = start
			if sleep(ctx, wait); ctx.Err() != nil {
				return time.Time{}, from, moved, ctx.Err()
			}
			continue
		}
		if more {
			// A full batch: the next step twice the time it covered.
			span = max(2*covered(ix.Prefix, start, kvs), minStep)
		}
		if len(kvs) > 0 {
			n, again, err := ix.moveRead(ctx, kvs, batch, &start, &skipped)
			moved += n
			if err != nil {
				return time.Time{}, from, moved, err
			}
			if again {
				continue
			}
		}
		switch {
		case more:
			continue
		case stepEnd != "": // read up to stepEnd: on, a longer step
			start, span = stepEnd, min(span*8, maxStep)
			continue
		}
		done = now
		if at, ok := keyTime(ix.Prefix, skipped); ok {
			// Batches another mover had the turn of: read from the
			// first of them again in a moment (longer while it stays
			// held).
			return ix.now().Add(ix.heldWait(skipped)), at, moved, nil
		}
		if ix.Turns != "" {
			ix.notHeld()
		}
		first, err := ix.first(ctx, start, now)
		if err != nil || first == nil {
			return time.Time{}, done, moved, err
		}
		at, _, ok := Parse(ix.Prefix, string(first.Key))
		if !ok {
			// Not an item's key: drop it, or it would stand first
			// for ever.
			if _, err := ix.Client.Delete(ctx, string(first.Key)); err != nil {
				return time.Time{}, done, moved, fmt.Errorf("due: drop %s: %w", first.Key, err)
			}
			continue
		}
		if !at.After(ix.now()) {
			continue // fell due meanwhile
		}
		return at, done, moved, nil
	}
}

// lingerFor is how long a read that found kvs, due by now, waits for
// more before it moves them: until Linger after the first fell due, when
// the read found fewer than a batch (full false) and Gather is set.
func (ix *Index) lingerFor(kvs []*mvccpb.KeyValue, full bool, now time.Time) time.Duration {
	if ix.Linger <= 0 || ix.Gather == nil || full || len(kvs) == 0 {
		return 0
	}
	at, ok := keyTime(ix.Prefix, string(kvs[0].Key))
	if !ok {
		return 0
	}
	return at.Add(ix.Linger).Sub(now)
}

// The reads of due items go in steps of time while the items due lie
// behind: a range that ends at now counts every item due and not moved
// yet (etcd counts every key of a range, whatever its limit), and with
// 190,000 segments due at once (a million tasks due over a minute, the
// movers behind) each read of a batch of 64 counted them all. A step
// starts at firstStep after the read's start; after a full batch it is
// twice the time the batch covered (at least minStep), and after a read
// that found fewer it grows eightfold (to maxStep: an item due years ago
// is reached in a dozen steps).
const (
	firstStep = 100 * time.Millisecond
	minStep   = time.Millisecond
	maxStep   = 100 * 365 * 24 * time.Hour
)

// readDue reads up to batch items due by now from key start on, within a
// step of span after start's due time when that ends before now (stepEnd
// is then the key the step ended at, where the next starts); more says
// the range may hold more than it returned. A start with no time (the
// index's prefix) is read to now.
func (ix *Index) readDue(ctx context.Context, start string, now time.Time, span time.Duration, batch int) (kvs []*mvccpb.KeyValue, more bool, stepEnd string, err error) {
	end := Bound(ix.Prefix, now.Add(time.Nanosecond))
	if at, ok := keyTime(ix.Prefix, start); ok {
		if reach := at.Add(span); reach.Before(now) {
			end, stepEnd = Bound(ix.Prefix, reach), Bound(ix.Prefix, reach)
		}
	}
	g, err := ix.Client.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(int64(batch)))
	if err != nil {
		return nil, false, "", fmt.Errorf("due: read %s: %w", ix.Prefix, err)
	}
	return g.Kvs, g.More, stepEnd, nil
}

// covered is the time from key start to the last of kvs, keys of the
// index under prefix (0 when either has no time).
func covered(prefix, start string, kvs []*mvccpb.KeyValue) time.Duration {
	from, ok := keyTime(prefix, start)
	if !ok || len(kvs) == 0 {
		return 0
	}
	to, ok := keyTime(prefix, string(kvs[len(kvs)-1].Key))
	if !ok {
		return 0
	}
	return to.Sub(from)
}

// keyTime is the due time a key of the index under prefix starts with,
// or the time a bound (Bound) is at; false for neither.
func keyTime(prefix, key string) (time.Time, bool) {
	ns, ok := keyspace.ParseTimeBound(prefix, key)
	return time.Unix(0, ns), ok
}

// horizons are how far ahead of now the reads for the next item end, in
// turn, until one finds it: a read that ends soon counts few keys. The
// first is short: while items fall due one after another (a million
// tasks due over a minute are 5,000 segments a second), the next is
// moments away, and a read a second ahead counted the 5,000 at every
// move.
var horizons = []time.Duration{10 * time.Millisecond, time.Second, time.Minute, time.Hour, 0}

// first returns the first item from start on (nil: none).
func (ix *Index) first(ctx context.Context, start string, now time.Time) (*mvccpb.KeyValue, error) {
	for _, h := range horizons {
		end := clientv3.GetPrefixRangeEnd(ix.Prefix)
		if h > 0 {
			end = Bound(ix.Prefix, now.Add(h))
		}
		g, err := ix.Client.Get(ctx, start, clientv3.WithRange(end), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil {
			return nil, fmt.Errorf("due: read %s: %w", ix.Prefix, err)
		}
		if len(g.Kvs) > 0 {
			return g.Kvs[0], nil
		}
	}
	return nil, nil
}

// MoveItems moves the items kvs, as read, in one request and returns how
// many it moved: what Promote does with a batch it read. A request whose
// reply was lost may be sent again with the same kvs: the items it moved
// no longer match their read, so it moves nothing twice.
func (ix *Index) MoveItems(ctx context.Context, kvs []*mvccpb.KeyValue) (int, error) {
	n, _, err := ix.move(ctx, kvs, turn{})
	return n, err
}

// rereadJitter bounds the random pause before a batch a gathered move
// lost to another mover is read again, so that two movers that read the
// same batch do not keep meeting.
const rereadJitter = 10 * time.Millisecond

// maxTxnOps is etcd's default --max-txn-ops: the most compares or
// operations at one level of a request, a nested transaction's allowance
// being what its parent's level left (128 less the larger of the
// parent's compares and operations).
const maxTxnOps = 128

// move moves the items kvs in one request and returns how many it moved.
// reread: a gathered move found some of kvs moved by another process
// since the read, and moved nothing: the caller reads them again (what
// is left of them moves gathered then, not one by one).
func (ix *Index) move(ctx context.Context, kvs []*mvccpb.KeyValue, t turn) (n int, reread bool, err error) {
	ctx, cancel := ix.moveCtx(ctx, t) // a hung request holds the turn no longer
	defer cancel()
	if ix.Gather != nil && len(kvs) > 1 {
		n, res, err := ix.moveGathered(ctx, kvs, t)
		if res == gatherLost || err != nil {
			ix.endTurn(t)
		}
		if err != nil || res != gatherRefused {
			return n, res == gatherLost, err
		}
	}
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
	// The turn ends in the request, a nested transaction, when the level
	// leaves it room (etcd gives a nested one maxTxnOps less the level's
	// operations), else after it.
	endAfter := t
	if t.key != "" && len(ops)+1 < maxTxnOps {
		ops, endAfter = append(ops, ix.endTurnOp(t)), turn{}
	}
	resp, err := ix.Client.Txn(ctx).Then(ops...).Commit()
	if err != nil {
		ix.endTurn(t)
		return 0, false, fmt.Errorf("due: move items of %s: %w", ix.Prefix, err)
	}
	ix.endTurn(endAfter)
	var won []*mvccpb.KeyValue
	for i, kv := range kvs {
		if resp.Responses[i].GetResponseTxn().GetSucceeded() {
			won = append(won, kv)
		}
	}
	if ix.OnMoved != nil && len(won) > 0 {
		ix.OnMoved(won)
	}
	metrics.DueMoves.WithLabelValues(cmp.Or(ix.Name, "due"), "one-by-one").Inc()
	return len(won), false, nil
}

// What a gathered move did: moved every item, moved none because
// another process moved some since the read, or moved none for any
// other reason (Gather's compares, a refused request, nothing to gather):
// the items then move one by one.
const (
	gatherMoved = iota
	gatherLost
	gatherRefused
)

// moveGathered moves the items kvs together (Gather) in one transaction.
// When it fails, the request's other branch reads the items' keys: all
// as read means Gather's compares failed (gatherRefused), else another
// process moved some (gatherLost).
func (ix *Index) moveGathered(ctx context.Context, kvs []*mvccpb.KeyValue, t turn) (moved, res int, err error) {
	extra, writes, err := ix.Gather(ctx, kvs)
	if err != nil || writes == nil {
		return 0, gatherRefused, err
	}
	cmps := make([]clientv3.Cmp, 0, len(kvs)+len(extra))
	flat := make([]clientv3.Op, 0, len(kvs)+len(writes))
	reads := make([]clientv3.Op, 0, len(kvs))
	for _, kv := range kvs {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		flat = append(flat, clientv3.OpDelete(string(kv.Key)))
		reads = append(reads, clientv3.OpGet(string(kv.Key), clientv3.WithKeysOnly()))
	}
	cmps, flat = append(cmps, extra...), append(flat, writes...)
	var shared []clientv3.Op
	if ix.Shared != nil {
		shared = ix.Shared(kvs)
	}
	if t.key != "" {
		shared = append(shared, ix.endTurnOp(t))
	}
	then, fits := pack(flat, max(len(cmps), len(reads)), len(shared))
	if !fits {
		return 0, gatherRefused, nil
	}
	resp, err := ix.Client.Txn(ctx).If(cmps...).Then(append(then, shared...)...).Else(reads...).Commit()
	if err != nil {
		// Refused (too large, say) or lost: one by one, which tells an
		// outage from a refusal by its own error; a refusal is no error
		// of the index (it would count at every move).
		cmp.Or(ix.Logger, slog.Default()).Debug("due: gathered move refused; moving one by one", "index", cmp.Or(ix.Name, "due"), "items", len(kvs), "err", err)
		return 0, gatherRefused, nil
	}
	if !resp.Succeeded {
		for i, kv := range kvs {
			if got := resp.Responses[i].GetResponseRange().Kvs; len(got) == 0 || got[0].ModRevision != kv.ModRevision {
				metrics.DueMoves.WithLabelValues(cmp.Or(ix.Name, "due"), "lost").Inc()
				return 0, gatherLost, nil
			}
		}
		return 0, gatherRefused, nil // Gather's compares: a change in what it read
	}
	if ix.OnMoved != nil {
		ix.OnMoved(kvs)
	}
	metrics.DueMoves.WithLabelValues(cmp.Or(ix.Name, "due"), "gathered").Inc()
	return len(kvs), gatherMoved, nil
}
