// Package kv holds the single-key conditional writes that everything which
// registers builds on: create a key only if it is absent, and create it or
// accept it as already there when it holds the same value under the same
// lease; and update a value by compare-and-swap. Each write is one etcd
// transaction conditional on what was read, so no client-side check can
// race.
package kv

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrExists is matched by the error of a create whose key is already there
// (with another value or under another lease).
var ErrExists = errors.New("kv: key exists")

// ExistsError describes the key that was in the way.
type ExistsError struct {
	Key            string
	Value          []byte
	Lease          clientv3.LeaseID
	CreateRevision int64
}

// Error implements error.
func (e *ExistsError) Error() string {
	if e.Lease != 0 {
		return fmt.Sprintf("key %s exists (created at revision %d, bound to lease %x)", e.Key, e.CreateRevision, int64(e.Lease))
	}
	return fmt.Sprintf("key %s exists (created at revision %d)", e.Key, e.CreateRevision)
}

// Unwrap returns ErrExists.
func (e *ExistsError) Unwrap() error { return ErrExists }

// Create writes key = value, bound to lease (0: no lease), only if key does
// not exist, and returns the revision of the write. When key exists it
// returns an *ExistsError and writes nothing.
func Create(ctx context.Context, c clientv3.KV, key string, value []byte, lease clientv3.LeaseID) (int64, error) {
	rev, created, err := createOrGet(ctx, c, key, value, lease)
	if err != nil {
		return 0, err
	}
	if created == nil {
		return rev, nil
	}
	return 0, created
}

// CreateOrValidate is Create made idempotent: when key already exists with
// the same value and bound to the same lease, it succeeds with created false
// and the revision at which the key was last written. Any other existing key
// is an *ExistsError, and nothing is written.
func CreateOrValidate(ctx context.Context, c clientv3.KV, key string, value []byte, lease clientv3.LeaseID) (rev int64, created bool, err error) {
	rev, exists, err := createOrGet(ctx, c, key, value, lease)
	if err != nil {
		return 0, false, err
	}
	if exists == nil {
		return rev, true, nil
	}
	if bytes.Equal(exists.Value, value) && exists.Lease == lease {
		return rev, false, nil
	}
	return 0, false, exists
}

// createOrGet creates key if it is absent; otherwise it reads what is there,
// in the same transaction, and returns it as an *ExistsError with rev the
// key's last write.
func createOrGet(ctx context.Context, c clientv3.KV, key string, value []byte, lease clientv3.LeaseID) (int64, *ExistsError, error) {
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(lease))
	}
	resp, err := c.Txn(ctx).
		If(clientv3.Compare(clientv3.Version(key), "=", 0)).
		Then(clientv3.OpPut(key, string(value), opts...)).
		Else(clientv3.OpGet(key)).
		Commit()
	if err != nil {
		return 0, nil, fmt.Errorf("kv: create %s: %w", key, err)
	}
	if resp.Succeeded {
		return resp.Header.Revision, nil, nil
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 { // cannot happen: the compare saw the key in the same revision
		return 0, nil, fmt.Errorf("kv: create %s: key vanished inside a transaction", key)
	}
	kv := kvs[0]
	return kv.ModRevision, &ExistsError{Key: key, Value: kv.Value, Lease: clientv3.LeaseID(kv.Lease), CreateRevision: kv.CreateRevision}, nil
}

// Update rewrites key with change(current value; nil when absent) by
// compare-and-swap on the key's mod revision, reading again and retrying
// when someone else wrote it in between, so concurrent updates of different
// parts of one value never undo each other. An error from change ends it
// with nothing written.
func Update(ctx context.Context, c clientv3.KV, key string, change func(old []byte) ([]byte, error)) error {
	for {
		g, err := c.Get(ctx, key)
		if err != nil {
			return fmt.Errorf("kv: read %s: %w", key, err)
		}
		var old []byte
		var mod int64
		if len(g.Kvs) == 1 {
			old, mod = g.Kvs[0].Value, g.Kvs[0].ModRevision
		}
		b, err := change(old)
		if err != nil {
			return err
		}
		resp, err := c.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", mod)).Then(clientv3.OpPut(key, string(b))).Commit()
		if err != nil {
			return fmt.Errorf("kv: write %s: %w", key, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
}
