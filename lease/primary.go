package lease

import (
	"context"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultPrimaryTTL is the TTL of the primary lease when none is given.
const DefaultPrimaryTTL = 10 * time.Second

var primary struct {
	mu    sync.Mutex
	cli   *clientv3.Client
	lease *Lease
}

// Primary returns the process-wide primary lease for cli, granting it on first
// use with ttl (0 means [DefaultPrimaryTTL]). Everything a process binds to
// its primary lease disappears together when the process dies.
//
// While the primary lease is held, every call returns the same *Lease and ttl
// and opts are ignored. Once it is lost or closed, the next call grants a new
// one: whoever bound work to the old lease has already seen its context
// cancelled and must start that work again under the new one. A call with a
// different client replaces the primary lease of the earlier client, which is
// left to its owner to close.
func Primary(ctx context.Context, cli *clientv3.Client, ttl time.Duration, opts ...Option) (*Lease, error) {
	primary.mu.Lock()
	defer primary.mu.Unlock()
	if primary.lease != nil && primary.cli == cli && primary.lease.Err() == nil {
		return primary.lease, nil
	}
	if ttl == 0 {
		ttl = DefaultPrimaryTTL
	}
	l, err := Grant(ctx, cli, ttl, opts...)
	if err != nil {
		return nil, err
	}
	primary.cli, primary.lease = cli, l
	return l, nil
}
