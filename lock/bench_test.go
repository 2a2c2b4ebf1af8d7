package lock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// benchSrv is an embedded etcd with fsync on, as users run it, started by the
// first benchmark and stopped by TestMain.
var (
	benchOnce sync.Once
	benchSrv  *etcdtest.Server
)

func fsyncServer(b *testing.B) *etcdtest.Server {
	benchOnce.Do(func() {
		benchSrv = etcdtest.MustStart(etcdtest.Options{Fsync: true})
		// Warm the server up (database file growth, first fsyncs) so that
		// whichever implementation runs first is not charged for it.
		cli := benchSrv.Client(b)
		var wg sync.WaitGroup
		for g := 0; g < 32; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("/warmup/%d", g)
				for i := 0; i < 200; i++ {
					_, _ = cli.Put(context.Background(), key, "x")
					_, _ = cli.Delete(context.Background(), key)
				}
			}()
		}
		wg.Wait()
	})
	return benchSrv
}

// resetServer compacts away all history and defragments the database, so
// that each run starts from the same server state whichever ran before it.
func resetServer(b *testing.B, cli *clientv3.Client, endpoint string) {
	ctx := context.Background()
	g, err := cli.Get(ctx, "/", clientv3.WithCountOnly())
	if err != nil {
		b.Fatal(err)
	}
	if _, err := cli.Compact(ctx, g.Header.Revision, clientv3.WithCompactPhysical()); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
		b.Fatal(err)
	}
	if _, err := cli.Defragment(ctx, endpoint); err != nil {
		b.Fatal(err)
	}
}

// contender is one acquire+release of key by one contender.
type contender func(ctx context.Context, key string) error

// BenchmarkLock compares acquire+release cycles of drover's etcd lock with
// etcd's own concurrency.Mutex, on the same embedded server in the same run:
// one key shared by 8 contenders, and 64 keys with one goroutine each.
func BenchmarkLock(b *testing.B) {
	cases := []struct {
		name       string
		contenders int
		keys       int
	}{
		{"contended-1key-8", 8, 1},
		{"spread-64keys-64", 64, 64},
	}
	impls := []struct {
		name string
		make func(b *testing.B, cli *clientv3.Client, ns string) contender
	}{
		{"drover", func(b *testing.B, cli *clientv3.Client, ns string) contender {
			locker, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns, TTL: 30 * time.Second})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = locker.Close(context.Background()) })
			return func(ctx context.Context, key string) error {
				l, err := locker.Acquire(ctx, key)
				if err != nil {
					return err
				}
				return l.Release(ctx)
			}
		}},
		{"etcd-mutex", func(b *testing.B, cli *clientv3.Client, ns string) contender {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(30))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = s.Close() })
			return func(ctx context.Context, key string) error {
				m := concurrency.NewMutex(s, "/"+ns+"/mutex/"+key)
				if err := m.Lock(ctx); err != nil {
					return err
				}
				return m.Unlock(ctx)
			}
		}},
	}
	for _, c := range cases {
		for _, impl := range []int{1, 0} {
			impl := impls[impl]
			b.Run(c.name+"/"+impl.name, func(b *testing.B) {
				s := fsyncServer(b)
				cli := s.Client(b)
				resetServer(b, cli, s.Endpoints()[0])
				ns := etcdtest.Namespace(b)
				workers := make([]contender, c.contenders)
				for i := range workers {
					workers[i] = impl.make(b, cli, ns)
				}
				var next atomic.Int64
				var wg sync.WaitGroup
				errs := make(chan error, c.contenders)
				b.ResetTimer()
				for i, w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						key := fmt.Sprintf("k%d", i%c.keys)
						for next.Add(1) <= int64(b.N) {
							if err := w(context.Background(), key); err != nil {
								errs <- err
								return
							}
						}
					}()
				}
				wg.Wait()
				b.StopTimer()
				close(errs)
				for err := range errs {
					b.Fatal(err)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
			})
		}
	}
}
