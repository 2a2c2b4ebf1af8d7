package agentserver_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errCrashed is what every write answers once a crashing client's
// writes are spent: the process died there, and wrote nothing more.
var errCrashed = errors.New("crashed: this process writes nothing more")

// crashClient is cli that makes its first n writes (puts, deletes,
// transactions) and then none, as a server killed after its nth write:
// its reads still answer, so that what it does next is what a restarted
// server finds.
func crashClient(t *testing.T, cli *clientv3.Client, n int64) *clientv3.Client {
	t.Helper()
	c := clientv3.NewCtxClient(context.Background())
	left := &atomic.Int64{}
	left.Store(n)
	c.KV = crashKV{KV: cli.KV, left: left}
	c.Watcher, c.Lease, c.Cluster, c.Maintenance, c.Auth = cli.Watcher, cli.Lease, cli.Cluster, cli.Maintenance, cli.Auth
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type crashKV struct {
	clientv3.KV
	left *atomic.Int64
}

func (k crashKV) spend() bool { return k.left.Add(-1) >= 0 }

func (k crashKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if !k.spend() {
		return nil, errCrashed
	}
	return k.KV.Put(ctx, key, val, opts...)
}

func (k crashKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	if !k.spend() {
		return nil, errCrashed
	}
	return k.KV.Delete(ctx, key, opts...)
}

func (k crashKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if !op.IsGet() && !k.spend() {
		return clientv3.OpResponse{}, errCrashed
	}
	return k.KV.Do(ctx, op)
}

func (k crashKV) Txn(ctx context.Context) clientv3.Txn { return &crashTxn{Txn: k.KV.Txn(ctx), kv: k} }

// crashTxn is a transaction of a crashing client: one that writes
// (a put or delete in either branch) is a write; one that only reads
// is not, so that a test's crash points count writes alone.
type crashTxn struct {
	clientv3.Txn
	kv     crashKV
	writes bool
}

func (t *crashTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *crashTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.writes = t.Txn.Then(ops...), t.writes || anyWrite(ops)
	return t
}
func (t *crashTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.writes = t.Txn.Else(ops...), t.writes || anyWrite(ops)
	return t
}

func anyWrite(ops []clientv3.Op) bool {
	for _, op := range ops {
		if !op.IsGet() {
			return true
		}
	}
	return false
}

func (t *crashTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.writes && !t.kv.spend() {
		return nil, errCrashed
	}
	return t.Txn.Commit()
}

// readCounter is cli that counts the keys its reads answer under prefix
// (set while it counts).
type readCounter struct {
	clientv3.KV
	prefix atomic.Pointer[string]
	n      atomic.Int64
}

func countingClient(cli *clientv3.Client) (*clientv3.Client, *readCounter) {
	c := clientv3.NewCtxClient(context.Background())
	rc := &readCounter{KV: cli.KV}
	c.KV = rc
	c.Watcher, c.Lease, c.Cluster, c.Maintenance, c.Auth = cli.Watcher, cli.Lease, cli.Cluster, cli.Maintenance, cli.Auth
	return c, rc
}

func (r *readCounter) count(kvs []*mvccpb.KeyValue) {
	p := r.prefix.Load()
	if p == nil {
		return
	}
	for _, kv := range kvs {
		if strings.HasPrefix(string(kv.Key), *p) {
			r.n.Add(1)
		}
	}
}

func (r *readCounter) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := r.KV.Get(ctx, key, opts...)
	if err == nil {
		r.count(resp.Kvs)
	}
	return resp, err
}

func (r *readCounter) Txn(ctx context.Context) clientv3.Txn {
	return &countTxn{Txn: r.KV.Txn(ctx), rc: r}
}

type countTxn struct {
	clientv3.Txn
	rc *readCounter
}

func (t *countTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *countTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *countTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *countTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err == nil {
		for _, r := range resp.Responses {
			if rr := r.GetResponseRange(); rr != nil {
				t.rc.count(rr.Kvs)
			}
		}
	}
	return resp, err
}

// hangupClient is cli whose first transaction that writes and leaves a
// run of thread other than first stored (a new run's admission) calls
// admitted, then returns only once its context ends (the request's
// time bound passed), or after 5 s.
func hangupClient(t *testing.T, cli *clientv3.Client, runs, first string, admitted func()) *clientv3.Client {
	t.Helper()
	c := clientv3.NewCtxClient(context.Background())
	c.KV = &hangupKV{KV: cli.KV, runs: runs, first: first, admitted: admitted}
	c.Watcher, c.Lease, c.Cluster, c.Maintenance, c.Auth = cli.Watcher, cli.Lease, cli.Cluster, cli.Maintenance, cli.Auth
	t.Cleanup(func() { _ = c.Close() })
	return c
}

type hangupKV struct {
	clientv3.KV
	runs, first string
	admitted    func()
	done        atomic.Bool
}

func (k *hangupKV) Txn(ctx context.Context) clientv3.Txn {
	return &hangupTxn{Txn: k.KV.Txn(ctx), kv: k, ctx: ctx}
}

type hangupTxn struct {
	clientv3.Txn
	kv     *hangupKV
	ctx    context.Context
	writes bool
}

func (t *hangupTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *hangupTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.Txn, t.writes = t.Txn.Then(ops...), t.writes || anyWrite(ops)
	return t
}

func (t *hangupTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err != nil || !resp.Succeeded || !t.writes || t.kv.done.Load() {
		return resp, err
	}
	g, gerr := t.kv.KV.Get(context.Background(), t.kv.runs, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if gerr != nil {
		return resp, err
	}
	for _, kv := range g.Kvs {
		if string(kv.Key) != t.kv.runs+t.kv.first && t.kv.done.CompareAndSwap(false, true) {
			t.kv.admitted()
			select {
			case <-t.ctx.Done():
			case <-time.After(5 * time.Second):
			}
			break
		}
	}
	return resp, err
}
