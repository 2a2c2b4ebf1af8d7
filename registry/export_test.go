package registry

import (
	"context"

	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// WithStartHook exports withStartHook to the tests.
var WithStartHook = withStartHook

// TakeOver re-creates r's key under l, taking it over from owned: the path
// a re-registration takes when the old lease still holds the key.
func TakeOver(ctx context.Context, r *Registration, l *lease.Lease, owned clientv3.LeaseID) error {
	return r.create(ctx, l, owned)
}

// RegisterWhenFreeTraced is RegisterWhenFree that tells onWait of each of
// its decisions: "wait" before a wait for a held id, then why the wait
// ended: "deleted", "timed out" or "broken".
func RegisterWhenFreeTraced(ctx context.Context, rt *process.Runtime, component string, ep Endpoint, onWait func(decision string)) (*Registration, error) {
	return registerWhenFree(ctx, rt, component, ep, func(end waitEnd, _ clientv3.LeaseID) {
		onWait(map[waitEnd]string{0: "wait", waitDeleted: "deleted", waitTimedOut: "timed out", waitBroken: "broken"}[end])
	})
}
