package lock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lease/fencetest"
	"github.com/droverhq/drover/lock"
)

// TestEtcdLockIsAFence runs the fence conformance suite against the etcd
// lock (which the task runner holds its tasks with): each claim is a locker
// of its own, with its own lease; a loss is its lease revoked.
func TestEtcdLockIsAFence(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	var mu sync.Mutex
	lockers := map[lease.Fence]*lock.Etcd{}
	fencetest.Exercise(t, fencetest.Harness{
		Client: cli,
		Key:    "/" + ns + "/fenced",
		Claim: func(ctx context.Context, id string) (lease.Fence, func(), error) {
			locker, err := lock.NewEtcd(ctx, srv.Client(t), lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
			if err != nil {
				return nil, nil, err
			}
			l, err := locker.AcquireFenced(ctx, id)
			if err != nil {
				_ = locker.Close(ctx)
				return nil, nil, err
			}
			mu.Lock()
			lockers[l] = locker
			mu.Unlock()
			return l, func() {
				_ = l.Release(context.Background())
				_ = locker.Close(context.Background())
			}, nil
		},
		Lose: func(ctx context.Context, f lease.Fence) error {
			mu.Lock()
			locker := lockers[f]
			mu.Unlock()
			_, err := cli.Revoke(ctx, locker.Lease().ID())
			return err
		},
	})
}

// TestCloseTwice: the etcd locker, its lease and a task runner on it close
// with Close(ctx) error, and a second Close is harmless.
func TestCloseTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	locker, err := lock.NewEtcd(ctx, srv.Client(t), lock.EtcdConfig{Namespace: etcdtest.Namespace(t), TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lease.Grant(ctx, srv.Client(t), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if err := locker.Close(ctx); err != nil {
			t.Fatalf("locker close %d: %v", i+1, err)
		}
		if err := l.Close(ctx); err != nil {
			t.Fatalf("lease close %d: %v", i+1, err)
		}
	}
}
