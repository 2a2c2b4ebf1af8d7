// Package storeguard is the data plane's side of the store-full guard: the
// data plane yields before the control plane.
//
// When etcd's database reaches its quota etcd raises its NOSPACE alarm and
// refuses every write that adds data, lease grants included, so every lock
// and worker of the fleet goes down until an operator disarms the alarm.
// To keep that from happening, the server's guard (cluster.Guard) writes the
// namespace's guard key, keyspace.Space.StoreFull, once the database passes
// a high-water mark below the quota, and deletes it once enough space is
// free again. Data-plane writers (queue submission, checkpoints) add one
// compare to their transaction, [NotFull], and return the typed error
// [drover.StoreFullError] (matched by [drover.ErrStoreFull]) when it fails;
// control-plane writers (leases, locks, the registry, flow control) and
// deletions add nothing, so they keep working in the space left above the
// high-water mark.
//
// The key is set as of the guard's last check. So that a burst does not
// pass the mark between two checks, a process that runs a guard also
// admits its own data-plane writes before they are sent: an [Admission]
// that the guard refreshes, and [NewKV] around the process's etcd client,
// which reserves each guarded transaction's size ([Cost]) against the
// headroom left and refuses it with the same error when it does not fit.
//
// A writer learns why its transaction failed in one of two ways: it reads
// the key in the transaction's Else branch ([GetOp], then [FromRange] on the
// response), which is atomic with the compare, or it reads it afterwards
// with [FullError].
package storeguard

import (
	"context"
	"fmt"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// NotFull is the compare a data-plane transaction adds to its If: it holds
// while the namespace's guard key does not exist.
func NotFull(keys keyspace.Space) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(keys.StoreFull()), "=", 0)
}

// GetOp reads the guard key; put it in a transaction's Else branch and pass
// its response to [FromRange].
func GetOp(keys keyspace.Space) clientv3.Op { return clientv3.OpGet(keys.StoreFull()) }

// FromRange returns the error the guard key read by [GetOp] stands for: a
// *drover.StoreFullError when the key exists, nil when it does not (r nil
// included).
func FromRange(r *pb.RangeResponse) error {
	if r == nil || len(r.Kvs) == 0 {
		return nil
	}
	return fromValue(r.Kvs[0].Value)
}

// FullError reads the namespace's guard key and returns a
// *drover.StoreFullError when it exists, nil when it does not, or the error
// of the read.
func FullError(ctx context.Context, kv clientv3.KV, keys keyspace.Space) error {
	g, err := kv.Get(ctx, keys.StoreFull())
	if err != nil {
		return fmt.Errorf("storeguard: read %s: %w", keys.StoreFull(), err)
	}
	if len(g.Kvs) == 0 {
		return nil
	}
	return fromValue(g.Kvs[0].Value)
}

// fromValue builds the error of a guard key's value. A value that is not
// the guard's JSON still refuses the write, with an error that matches
// drover.ErrStoreFull.
func fromValue(v []byte) error {
	e, err := drover.ParseStoreFull(v)
	if err != nil {
		return fmt.Errorf("%w (the guard key holds an unreadable value: %w)", drover.ErrStoreFull, err)
	}
	return e
}

// Set writes e as the guard key of every namespace in keys, in one
// transaction: from then on their data-plane writes are refused. It is a
// plain put, not guarded: the guard itself is control plane.
func Set(ctx context.Context, kv clientv3.KV, e *drover.StoreFullError, keys ...keyspace.Space) error {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpPut(k.StoreFull(), e.Value())
	}
	if _, err := kv.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("storeguard: set the guard keys: %w", err)
	}
	return nil
}

// Clear deletes the guard key of every namespace in keys, in one
// transaction: their data-plane writes are accepted again.
func Clear(ctx context.Context, kv clientv3.KV, keys ...keyspace.Space) error {
	ops := make([]clientv3.Op, len(keys))
	for i, k := range keys {
		ops[i] = clientv3.OpDelete(k.StoreFull())
	}
	if _, err := kv.Txn(ctx).Then(ops...).Commit(); err != nil {
		return fmt.Errorf("storeguard: clear the guard keys: %w", err)
	}
	return nil
}
