package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/internal/proctest"
	"github.com/droverhq/drover/lock/locktest"
)

// TestConformance runs the lock.Locker suite against the etcd backend,
// and the cross-process part (holder processes counting under the lock,
// killed or paused while they hold it) with a TTL of 2 s.
func TestConformance(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	newLocker := func(t *testing.T, ns, id string) lock.Locker { return newLocker(t, srv.Client(t), ns, ttl, id) }
	locktest.Exercise(context.Background(), t, newLocker, locktest.Options{TTL: ttl,
		Expire: func(ctx context.Context, t *testing.T, _ string, _ lock.Locker, l lock.Lock) {
			if _, err := srv.Client(t).Delete(ctx, l.(*lock.EtcdLock).Key()); err != nil {
				t.Fatal(err)
			}
		}})
	t.Run("processes", func(t *testing.T) {
		t.Parallel()
		proctest.Exercise(t, proctest.Backend{NewLocker: newLocker, Hold: "hold", Counter: "counter", Env: etcdEnv()})
	})
}
