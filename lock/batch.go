package lock

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

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
	cli     *clientv3.Client
	mu      sync.Mutex
	busy    bool
	waiting []*batchCall
	// requests counts the requests sent, txns the transactions in them.
	requests, txns atomic.Int64
}

// batchMax is the most transactions one request carries (etcd takes 128
// operations a level).
const batchMax = 64

// batchTimeout bounds a combined request: it is not cut short by one
// caller's context, since it carries the others' transactions too.
const batchTimeout = 10 * time.Second

// NewBatcher returns a Batcher that sends on cli.
func NewBatcher(cli *clientv3.Client) *Batcher { return &Batcher{cli: cli} }

// Counts returns how many requests the Batcher sent and how many
// transactions they carried.
func (b *Batcher) Counts() (requests, txns int64) { return b.requests.Load(), b.txns.Load() }

// batchCall is one transaction waiting: its lock name, its parts, its
// answer once sent, and done, closed when the answer is there or when the
// call is to send the next request itself (lead).
type batchCall struct {
	name string
	cmps []clientv3.Cmp
	then []clientv3.Op
	els  []clientv3.Op
	resp *clientv3.TxnResponse
	err  error
	lead bool
	done chan struct{}
}

// txn commits If(cmps).Then(then).Else(els), about lock name, with the
// transactions of other callers that arrive at the same time. A nil
// Batcher sends it alone on cli.
func (b *Batcher) txn(ctx context.Context, cli *clientv3.Client, name string, cmps []clientv3.Cmp, then, els []clientv3.Op) (*clientv3.TxnResponse, error) {
	if b == nil {
		return cli.Txn(ctx).If(cmps...).Then(then...).Else(els...).Commit()
	}
	call := &batchCall{name: name, cmps: cmps, then: then, els: els, done: make(chan struct{})}
	b.mu.Lock()
	b.waiting = append(b.waiting, call)
	if b.busy {
		b.mu.Unlock()
		<-call.done // the sender always answers, within batchTimeout
		if !call.lead {
			return call.resp, call.err
		}
	} else {
		b.busy = true
		b.mu.Unlock()
	}
	b.send(ctx, b.take())
	b.handOn()
	return call.resp, call.err
}

// take removes from the waiting calls those the next request carries: in
// order, one per lock name, up to batchMax. The call that sends it is
// first.
func (b *Batcher) take() []*batchCall {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := map[string]bool{}
	var batch, left []*batchCall
	for _, c := range b.waiting {
		if len(batch) == batchMax || names[c.name] {
			left = append(left, c)
			continue
		}
		names[c.name] = true
		batch = append(batch, c)
	}
	b.waiting = left
	return batch
}

// send sends batch in one request and answers every call of it but the
// first, which sends it.
func (b *Batcher) send(ctx context.Context, batch []*batchCall) {
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), batchTimeout)
	defer cancel()
	b.requests.Add(1)
	b.txns.Add(int64(len(batch)))
	defer func() {
		for _, c := range batch[1:] {
			close(c.done)
		}
	}()
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

// handOn makes the first waiting call the sender of the next request, or
// ends the sending when none waits.
func (b *Batcher) handOn() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.waiting) == 0 {
		b.busy = false
		b.waiting = nil
		return
	}
	next := b.waiting[0]
	next.lead = true
	close(next.done)
}
