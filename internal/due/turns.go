package due

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A mover's turn over a batch (Index.Turns) is a key whose value is the
// mover's id and which is bound to a short etcd lease of the mover's own,
// granted for TurnTTL and never kept alive: the mover grants a new one
// when what is left of the last is less than a move may take
// (RequestTimeout) and a margin, and bounds each move under a turn to end
// a margin before the lease does (turn.until) as well, so a move ends
// within its turn however long the turn request took (a move after a
// slow one is only shorter). A turn thus ends on its own, in etcd's time,
// TurnTTL at most after it was taken, whatever its mover does: a move
// that hangs, a process stopped, a turn request that committed but
// answered an error, a delete after a failed move that did not reach
// etcd. Another mover then finds the key absent and takes it with the
// same compare (create revision 0) as any turn, so two cannot both take
// it; a mover deletes a turn key only while it holds its id, so a late
// delete never ends another mover's turn. The lease needs no clocks to
// agree between machines (a time in the value would: a mover whose clock
// ran ahead would take live turns over) and costs one grant a mover
// every few seconds while it takes turns and nothing at rest. Turns are
// advisory (every move compares its items as read): a mover that cannot
// grant a lease moves without them.
const (
	// DefaultTurnTTL is the life of a mover's turn lease when
	// Index.TurnTTL is zero.
	DefaultTurnTTL = 8 * time.Second
	// DefaultRequestTimeout bounds each move and turn request of an
	// index with turns when Index.RequestTimeout is zero.
	DefaultRequestTimeout = 3 * time.Second
	// turnMargin is what a turn lease must have left, beyond a move's
	// bound, for a mover to take turns under it.
	turnMargin = time.Second
)

// turnWait is how soon a mover reads again the batches another mover
// had the turn of (Index.Turns); while the same batch stays held the wait
// doubles, up to turnWaitMax, so a batch held by a hung mover is not read
// fifty times a second until its lease ends.
const (
	turnWait    = 20 * time.Millisecond
	turnWaitMax = time.Second
)

// turn is a mover's turn over a batch: its key ("" for none) and when a
// move under it must end (a margin before its lease does).
type turn struct {
	key   string
	until time.Time
}

// heldWait is how long to wait before reading again the batches from
// first on, the first item of the first batch another mover had the turn
// of: turnWait, doubled each time in a row the same batch was held.
func (ix *Index) heldWait(first string) time.Duration {
	ix.turnMu.Lock()
	defer ix.turnMu.Unlock()
	if first == ix.held && ix.heldFor > 0 {
		ix.heldFor = min(2*ix.heldFor, turnWaitMax)
	} else {
		ix.held, ix.heldFor = first, turnWait
	}
	return ix.heldFor
}

// notHeld forgets the batch heldWait last waited for: a read found no
// batch held.
func (ix *Index) notHeld() {
	ix.turnMu.Lock()
	defer ix.turnMu.Unlock()
	ix.held, ix.heldFor = "", 0
}

// parallel is how many batches a read takes (Index.Parallel), at least
// one and at most what one turn request holds.
func (ix *Index) parallel() int {
	return min(max(1, ix.Parallel), maxTxnOps-1)
}

// batchSize is how many items a request moves (Index.Batch), at most
// what one request holds.
func (ix *Index) batchSize() int {
	if ix.Batch <= 0 {
		return DefaultBatch
	}
	return min(ix.Batch, maxTxnOps)
}

// requestTimeout is the bound of each move and turn request (0: none).
func (ix *Index) requestTimeout() time.Duration {
	if ix.RequestTimeout > 0 || ix.Turns == "" {
		return ix.RequestTimeout
	}
	return DefaultRequestTimeout
}

// requestCtx is ctx bounded by the index's request timeout.
func (ix *Index) requestCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if d := ix.requestTimeout(); d > 0 {
		return context.WithTimeout(ctx, d)
	}
	return context.WithCancel(ctx)
}

// turnTTL is the life of a turn lease.
func (ix *Index) turnTTL() time.Duration {
	if ix.TurnTTL > 0 {
		return ix.TurnTTL
	}
	return DefaultTurnTTL
}

// holderID is the id the index's turn keys carry: Index.Holder if set, else
// one made once for the index (host, process and a random part).
func (ix *Index) holderID() string {
	ix.turnMu.Lock()
	defer ix.turnMu.Unlock()
	if ix.holder == "" {
		ix.holder = ix.Holder
	}
	if ix.holder == "" {
		host, _ := os.Hostname()
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		ix.holder = fmt.Sprintf("%s/%d/%s", host, os.Getpid(), hex.EncodeToString(b))
	}
	return ix.holder
}

// turnLease returns a lease of the mover's own and when a move under it
// must end (turnMargin before the lease does), granting one when the last
// has less than a move's bound and turnMargin left. The lease is not
// revoked: its turns end with it.
func (ix *Index) turnLease(ctx context.Context) (clientv3.LeaseID, time.Time, error) {
	ix.turnMu.Lock()
	defer ix.turnMu.Unlock()
	if ix.lease != 0 && time.Until(ix.leaseEnd) > ix.requestTimeout()+turnMargin {
		return ix.lease, ix.leaseEnd.Add(-turnMargin), nil
	}
	ttl := ix.turnTTL()
	began := time.Now() // before etcd starts the lease's time: its end is no earlier
	rctx, cancel := ix.requestCtx(ctx)
	defer cancel()
	l, err := ix.Client.Grant(rctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return 0, time.Time{}, fmt.Errorf("due: grant a turn lease for %s: %w", ix.Prefix, err)
	}
	ix.lease, ix.leaseEnd = l.ID, began.Add(time.Duration(l.TTL)*time.Second)
	return ix.lease, ix.leaseEnd.Add(-turnMargin), nil
}

// forgetLease drops the cached lease id, if it is still lease: etcd no
// longer has it (revoked, or ended early), and the next turns need a new one.
func (ix *Index) forgetLease(lease clientv3.LeaseID) {
	ix.turnMu.Lock()
	defer ix.turnMu.Unlock()
	if ix.lease == lease {
		ix.lease = 0
	}
}

// takeTurns takes the turn of each batch whose turn key is absent, or
// is this mover's already (a turn request that committed but answered an
// error, a turn whose delete was lost), in one request, and returns the
// turns it has, one with no key for a batch another mover has; nil
// without turns (every batch is this mover's): no Turns, more batches
// than a request holds, or no lease to be had (turns are advisory: the
// moves still compare their items).
func (ix *Index) takeTurns(ctx context.Context, batches [][]*mvccpb.KeyValue) ([]turn, error) {
	if ix.Turns == "" || len(batches) >= maxTxnOps {
		return nil, nil
	}
	for try := 0; ; try++ {
		lease, until, err := ix.turnLease(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil, err
			}
			ix.grantFailed(err)
			return nil, nil
		}
		turns, err := ix.putTurns(ctx, batches, lease, until)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) && try == 0 {
			ix.forgetLease(lease) // revoked or ended early: a new one
			continue
		}
		return turns, err
	}
}

// grantFailed logs, at most once per errorLogEvery, that a turn lease
// could not be granted and the mover moves without turns.
func (ix *Index) grantFailed(err error) {
	ix.turnMu.Lock()
	defer ix.turnMu.Unlock()
	if !ix.grantLogged.IsZero() && time.Since(ix.grantLogged) < errorLogEvery {
		return
	}
	ix.grantLogged = time.Now()
	cmp.Or(ix.Logger, slog.Default()).Warn("due: no turn lease; moving without turns", "index", cmp.Or(ix.Name, "due"), "prefix", ix.Prefix, "err", err)
}

// putTurns is takeTurns' request under lease, a move under a turn ending
// by until.
func (ix *Index) putTurns(ctx context.Context, batches [][]*mvccpb.KeyValue, lease clientv3.LeaseID, until time.Time) ([]turn, error) {
	holder := ix.holderID()
	turns := make([]turn, len(batches))
	ops := make([]clientv3.Op, len(batches))
	for i, b := range batches {
		key := ix.Turns + strings.TrimPrefix(string(b[0].Key), ix.Prefix)
		turns[i] = turn{key: key, until: until}
		ops[i] = clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(key), "=", 0)},
			[]clientv3.Op{clientv3.OpPut(key, holder, clientv3.WithLease(lease))},
			[]clientv3.Op{clientv3.OpGet(key)})
	}
	rctx, cancel := ix.requestCtx(ctx)
	defer cancel()
	resp, err := ix.Client.Txn(rctx).Then(ops...).Commit()
	if err != nil {
		return nil, fmt.Errorf("due: take the turns of %s: %w", ix.Prefix, err)
	}
	for i, r := range resp.Responses {
		t := r.GetResponseTxn()
		if t.GetSucceeded() {
			continue
		}
		if got := t.GetResponses(); len(got) == 1 {
			if kvs := got[0].GetResponseRange().GetKvs(); len(kvs) == 1 && string(kvs[0].Value) == holder {
				continue // this mover's own turn
			}
		}
		turns[i] = turn{}
	}
	return turns, nil
}

// endTurnOp deletes the turn key t, if it still holds this mover's id (a
// nested transaction: one compare, one operation).
func (ix *Index) endTurnOp(t turn) clientv3.Op {
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(t.key), "=", ix.holderID())},
		[]clientv3.Op{clientv3.OpDelete(t.key)}, nil)
}

// endTurn deletes the turn key of t (none: nothing) after a move that
// did not, if it still holds this mover's id: after its lease ended the
// key may be another mover's turn (its lease would end it, in the end).
func (ix *Index) endTurn(t turn) {
	if t.key == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), max(ix.requestTimeout(), time.Second))
	defer cancel()
	_, _ = ix.Client.Txn(ctx).If(clientv3.Compare(clientv3.Value(t.key), "=", ix.holderID())).Then(clientv3.OpDelete(t.key)).Commit()
}

// moveCtx is ctx bounded for a move under t: by the request timeout and,
// under a turn, by t.until, so that the move ends within its turn.
func (ix *Index) moveCtx(ctx context.Context, t turn) (context.Context, context.CancelFunc) {
	ctx, cancel := ix.requestCtx(ctx)
	if t.key == "" || t.until.IsZero() {
		return ctx, cancel
	}
	tctx, tcancel := context.WithDeadline(ctx, t.until)
	return tctx, func() { tcancel(); cancel() }
}

// turnOf is batch i's turn (none without turns).
func turnOf(turns []turn, i int) turn {
	if turns == nil {
		return turn{}
	}
	return turns[i]
}
