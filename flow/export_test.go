package flow

import (
	"context"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// SetLimiterClock makes l refill its bucket by now; call it before l is
// used.
func SetLimiterClock(l *Limiter, now func() time.Time) { l.now = now }

// SetBreakerClock makes b read time from now; call it before b is used.
func SetBreakerClock(b *Breaker, now func() time.Time) { b.now = now }

// TakeTokensAt is TakeTokens with the bucket refilled by now.
func TakeTokensAt(ctx context.Context, cli *clientv3.Client, ns, name string, n int64, now func() time.Time) (TakeResult, error) {
	return takeTokens(ctx, cli, ns, name, n, now)
}
