package redislock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/internal/proctest"
	"github.com/droverhq/drover/lock/locktest"
	"github.com/droverhq/drover/lock/redislock"
	"github.com/redis/go-redis/v9"
)

// TestConformance runs the lock.Locker suite, and its cross-process part,
// against the Redis backend and Redlock on three servers, with a TTL of
// 1 s.
func TestConformance(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		rdb := redisClient(t)
		newLocker := func(t *testing.T, ns, id string) lock.Locker { return newRedisLocker(t, rdb, ns, ttl, id) }
		locktest.Exercise(context.Background(), t, newLocker, locktest.Options{TTL: ttl,
			Expire: func(ctx context.Context, t *testing.T, ns string, _ lock.Locker, l lock.Lock) {
				expire(ctx, t, []redis.UniversalClient{rdb}, ns, l.Name())
			}})
		t.Run("processes", func(t *testing.T) {
			t.Parallel()
			proctest.Exercise(t, proctest.Backend{NewLocker: newLocker, Hold: "redis-hold", Counter: "redis-counter",
				Env: []string{"H_REDIS=" + rdb.Options().Addr}})
		})
	})
	t.Run("redlock", func(t *testing.T) {
		t.Parallel()
		servers, _ := redisServers(t, 3)
		var addrs []string
		for _, c := range servers {
			addrs = append(addrs, c.(*redis.Client).Options().Addr)
		}
		newLocker := func(t *testing.T, ns, id string) lock.Locker {
			l, err := redislock.NewRedlock(servers, redislock.RedlockConfig{Namespace: ns, TTL: ttl, HolderID: id})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}
		locktest.Exercise(context.Background(), t, newLocker, locktest.Options{TTL: ttl, HeldTokenIsOneServers: true,
			Expire: func(ctx context.Context, t *testing.T, ns string, _ lock.Locker, l lock.Lock) {
				expire(ctx, t, servers, ns, l.Name())
			}})
		t.Run("processes", func(t *testing.T) {
			t.Parallel()
			proctest.Exercise(t, proctest.Backend{NewLocker: newLocker, Hold: "redlock-hold", Counter: "redlock-counter",
				Env: []string{"H_REDIS=" + strings.Join(addrs, ",")}})
		})
	})
}

// expire deletes the holder key of lock name of namespace ns on every
// server, as a failover to a replica that lacked it would.
func expire(ctx context.Context, t *testing.T, servers []redis.UniversalClient, ns, name string) {
	t.Helper()
	for _, rdb := range servers {
		if err := rdb.Del(ctx, "drover:{"+ns+":"+name+"}:holder").Err(); err != nil {
			t.Fatal(err)
		}
	}
}
