package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
)

// TestBatcherMutualExclusion: 32 lockers, each with a lease of its own and
// all sharing one Batcher, try-acquire and release two lock names (half of
// them each) over and over. Their transactions go to etcd together (the
// Batcher counts fewer requests than transactions), and still at most one
// holds a name at a time, every release of a held lock succeeds, and the
// tokens of each name only grow.
func TestBatcherMutualExclusion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	b := lock.NewBatcher(cli)
	var holders [2]atomic.Int32
	var mu sync.Mutex
	last := [2]int64{}
	var grants atomic.Int64
	var wg sync.WaitGroup
	for g := 0; g < 32; g++ {
		locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 10e9, HolderID: fmt.Sprintf("g%d", g), Batcher: b})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = locker.Close(ctx) })
		k := g % 2
		name := fmt.Sprintf("batched-%d", k)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 40; i++ {
				l, err := locker.TryAcquireFenced(ctx, name)
				var held *lock.HeldError
				if errors.As(err, &held) {
					continue
				}
				if err != nil {
					t.Error(err)
					return
				}
				if n := holders[k].Add(1); n != 1 {
					t.Errorf("%s held by %d lockers at once", name, n)
				}
				mu.Lock()
				if l.Token() <= last[k] {
					t.Errorf("%s granted with token %d after token %d", name, l.Token(), last[k])
				}
				last[k] = l.Token()
				mu.Unlock()
				grants.Add(1)
				holders[k].Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Errorf("release of %s: %v", name, err)
				}
			}
		}()
	}
	wg.Wait()
	requests, txns := b.Counts()
	t.Logf("%d grants; %d transactions in %d requests", grants.Load(), txns, requests)
	if grants.Load() == 0 || requests >= txns {
		t.Fatalf("%d grants, %d transactions in %d requests: want grants, and fewer requests than transactions", grants.Load(), txns, requests)
	}
}

// TestBatcherSendsAloneUnderCallersContext: a transaction that goes to
// etcd alone is sent under its caller's context, as without a Batcher: a
// caller whose context has ended acquires nothing.
func TestBatcherSendsAloneUnderCallersContext(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	locker, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns, TTL: 10e9, HolderID: "w", Batcher: lock.NewBatcher(cli)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locker.Close(context.Background()) })
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if l, err := locker.TryAcquireFenced(ctx, "gone"); err == nil {
		t.Fatalf("acquired with token %d under an ended context", l.Token())
	}
	st, err := locker.Status(context.Background(), "gone")
	if err != nil || st.Held {
		t.Fatalf("after an acquisition under an ended context: held %t, err %v", st.Held, err)
	}
}
