package lock

import (
	"context"
	"slices"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/internal/groupcommit"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A Batcher combines the try-acquisitions and releases that many lockers
// (Etcd, sharing the Batcher through EtcdConfig.Batcher) send at the same
// time into fewer etcd requests: the first to arrive while none is being
// sent goes alone, at once; those that arrive meanwhile go together next,
// each as a nested transaction of one request (group commit). Each keeps
// its own comparisons and its own answer; the request's revision is each
// one's revision, so a lock acquired in it has that revision as its token,
// exactly as alone. etcd evaluates every comparison of a request before it
// applies any write, so no two transactions about the same lock name go in
// one request: a second waits for the next. An HTTP server, where many
// sessions' requests arrive at once on one etcd client, is where this
// pays: one request's fixed cost (gRPC, raft entry, fsync, apply) is
// shared.
//
// No library offers this for etcd (its client sends each Txn as a
// request of its own), so it is written here.
type Batcher struct {
	cli  *clientv3.Client
	line groupcommit.Line[*batchCall]
	// requests counts the requests sent, txns the transactions in them.
	requests, txns atomic.Int64
}

// batchMax is the most transactions one request carries (etcd takes 128
// operations a level).
const batchMax = 64

// batchTimeout bounds a combined request: it is not cut short by one
// caller's context, since it carries the others' transactions too. A
// caller still waiting for its turn leaves when its context ends.
const batchTimeout = 10 * time.Second

// NewBatcher returns a Batcher that sends on cli.
func NewBatcher(cli *clientv3.Client) *Batcher { return &Batcher{cli: cli} }

// Counts returns how many requests the Batcher sent and how many
// transactions they carried.
func (b *Batcher) Counts() (requests, txns int64) { return b.requests.Load(), b.txns.Load() }

// batchCall is one transaction: its lock name, its parts, and its answer
// once sent.
type batchCall struct {
	name string
	cmps []clientv3.Cmp
	then []clientv3.Op
	els  []clientv3.Op
	resp *clientv3.TxnResponse
	err  error
}

// txn commits If(cmps).Then(then).Else(els), about lock name, with the
// transactions of other callers that arrive at the same time. A nil
// Batcher sends it alone on cli.
func (b *Batcher) txn(ctx context.Context, cli *clientv3.Client, name string, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if b == nil {
		return cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	}
	call := &batchCall{name: name, cmps: cmps, then: then, els: els}
	lead, err := b.line.JoinContext(ctx, call)
	if err != nil {
		return nil, err // ctx ended while it waited: nothing was sent
	}
	if !lead {
		return call.resp, call.err
	}
	// The next request: in order, one per lock name, up to batchMax.
	batch, calls := b.line.Take(func(taken []*batchCall, next *batchCall) bool {
		return len(taken) < batchMax && !slices.ContainsFunc(taken, func(c *batchCall) bool { return c.name == next.name })
	})
	b.send(ctx, batch)
	groupcommit.Answer(calls)
	b.line.HandOn()
	return call.resp, call.err
}

// send sends batch in one request, and writes each call's answer. A batch
// of the sender's transaction alone is sent under the sender's ctx, as
// without a Batcher; one that carries others' too is not cut short by it.
func (b *Batcher) send(ctx context.Context, batch []*batchCall) {
	if len(batch) > 1 {
		ctx = context.WithoutCancel(ctx)
	}
	sctx, cancel := context.WithTimeout(ctx, batchTimeout)
	defer cancel()
	b.requests.Add(1)
	b.txns.Add(int64(len(batch)))
	if len(batch) == 1 {
		c := batch[0]
		c.resp, c.err = b.cli.Txn(sctx).If(c.cmps...).Then(c.then...).Else(c.els...).Commit()
		return
	}
	ops := make([]clientv3.Op, len(batch))
	for i, c := range batch {
		ops[i] = clientv3.OpTxn(c.cmps, c.then, c.els)
	}
	resp, err := b.cli.Txn(sctx).Then(ops...).Commit()
	for i, c := range batch {
		if err != nil {
			c.err = err
			continue
		}
		r := resp.Responses[i].GetResponseTxn()
		c.resp = (*clientv3.TxnResponse)(&pb.TxnResponse{Header: resp.Header, Succeeded: r.GetSucceeded(), Responses: r.GetResponses()})
	}
}
