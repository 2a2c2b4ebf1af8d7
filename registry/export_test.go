package registry

import (
	"context"

	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// WithStartHook exports withStartHook to the tests.
var WithStartHook = withStartHook

// TakeOver re-creates r's key under l, taking it over from owned: the path
// a re-registration takes when the old lease still holds the key.
func TakeOver(ctx context.Context, r *Registration, l *lease.Lease, owned clientv3.LeaseID) error {
	return r.create(ctx, l, owned)
}
