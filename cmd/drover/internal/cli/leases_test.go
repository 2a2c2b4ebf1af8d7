package cli_test

import (
	"context"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// grantedTTLs returns the granted TTL, in seconds, of the lease of each key
// under prefix that has one: what the process that wrote them decided, so
// that a test of "gone within the TTL after a SIGKILL" checks the TTL and
// leaves the expiry to etcd instead of timing it on a busy machine.
func grantedTTLs(t *testing.T, prefix string) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	cli := srv.Client(t)
	g, err := cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, kv := range g.Kvs {
		if kv.Lease == 0 {
			continue
		}
		ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
		if err != nil {
			t.Fatal(err)
		}
		out[string(kv.Key)] = ttl.GrantedTTL
	}
	return out
}
