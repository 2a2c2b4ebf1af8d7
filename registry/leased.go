package registry

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// This file registers endpoints for clients that keep a lease of their own
// alive instead of a process.Runtime (the HTTP API's sessions).

// PutLeased writes ep under component bound to lease: created when absent,
// rewritten in place when already bound to lease (its create revision
// stays; watchers see one Put), refused with a *DuplicateError (matching
// [ErrDuplicate]) when bound to another lease or to none, and nothing is
// written then. The default subject is "{namespace}.{component}.{id}".
// Invalid input is a drover.InputError. It returns the endpoint as
// written, and whether it was created.
func PutLeased(ctx context.Context, cli *clientv3.Client, ns, component string, ep Endpoint, lease clientv3.LeaseID) (Instance, bool, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return Instance{}, false, err
	}
	if err := CheckComponent("component", component); err != nil {
		return Instance{}, false, err
	}
	if err := ep.Check(); err != nil {
		return Instance{}, false, err
	}
	if ep.Subject == "" {
		ep.Subject = keys.Namespace() + "." + component + "." + ep.ID
	}
	value, err := ep.encode()
	if err != nil {
		return Instance{}, false, err
	}
	key := keys.Endpoint(component, ep.ID)
	put := clientv3.OpPut(key, string(value), clientv3.WithLease(lease))
	for {
		// Absent: create. Bound to lease: rewrite. Otherwise: read who holds it.
		resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).Then(put).
			Else(clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.LeaseValue(key), "=", lease)}, []clientv3.Op{put, clientv3.OpGet(key)}, []clientv3.Op{clientv3.OpGet(key)})).
			Commit()
		if err != nil {
			return Instance{}, false, fmt.Errorf("registry: register %s: %w", key, err)
		}
		in := Instance{Component: component, Lease: int64(lease), CreateRevision: resp.Header.Revision, ModRevision: resp.Header.Revision}
		_ = json.Unmarshal(value, &in.Endpoint)
		if resp.Succeeded {
			return in, true, nil
		}
		inner := resp.Responses[0].GetResponseTxn()
		if inner.Succeeded {
			if kvs := inner.Responses[1].GetResponseRange().Kvs; len(kvs) == 1 {
				in.CreateRevision = kvs[0].CreateRevision
			}
			return in, false, nil
		}
		kvs := inner.Responses[0].GetResponseRange().Kvs
		if len(kvs) == 0 {
			continue // deleted in between: try again
		}
		return Instance{}, false, &DuplicateError{Component: component, ID: ep.ID, Lease: clientv3.LeaseID(kvs[0].Lease), CreateRevision: kvs[0].CreateRevision}
	}
}

// DeleteLeased deletes endpoint id of component if it is bound to lease;
// [ErrNotRegistered] otherwise (absent, or another's), and nothing is
// deleted then.
func DeleteLeased(ctx context.Context, cli *clientv3.Client, ns, component, id string, lease clientv3.LeaseID) error {
	keys, err := keyspace.New(ns)
	if err != nil {
		return err
	}
	if err := CheckComponent("component", component); err != nil {
		return err
	}
	if err := keyspace.CheckName("endpoint id", id); err != nil {
		return err
	}
	key := keys.Endpoint(component, id)
	resp, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), ">", 0), clientv3.Compare(clientv3.LeaseValue(key), "=", lease)).
		Then(clientv3.OpDelete(key)).Commit()
	if err != nil {
		return fmt.Errorf("registry: deregister %s: %w", key, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("%w: %s is not bound to session %x", ErrNotRegistered, key, int64(lease))
	}
	return nil
}

// Decode returns the endpoint of an etcd key-value of namespace keys, and
// false for a key that is not an endpoint key; a value that is not an
// endpoint's JSON keeps only the component and id from its key. It is how
// a raw watch of Space.Components reads its events.
func Decode(keys keyspace.Space, kv *mvccpb.KeyValue) (Instance, bool) { return decode(keys, kv) }
