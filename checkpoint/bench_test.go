package checkpoint_test

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
	"github.com/droverhq/drover/lock"
)

// BenchmarkPut measures the latency of one checkpoint write on a thread
// (read the head, write the next checkpoint), on etcd (embedded, fsync on)
// and PostgreSQL, without a lock (compare-and-swap only) and under an etcd
// thread lock taken and released around each write. It reports p50 and p99.
func BenchmarkPut(b *testing.B) {
	own, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer own.Stop()
	cli := own.Client(b)
	ctx := context.Background()
	stores := map[string]func(b *testing.B, ns string) checkpoint.Store{
		"etcd": func(b *testing.B, ns string) checkpoint.Store {
			s, err := checkpoint.NewEtcd(cli, ns)
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
		"postgres": func(b *testing.B, ns string) checkpoint.Store {
			s, err := checkpoint.NewPostgres(ctx, servicetest.Postgres(b), ns)
			if err != nil {
				b.Fatal(err)
			}
			return s
		},
	}
	for _, store := range []string{"etcd", "postgres"} {
		for _, locked := range []bool{false, true} {
			name := store + "/cas"
			if locked {
				name = store + "/locked"
			}
			b.Run(name, func(b *testing.B) {
				ns := etcdtest.Namespace(b)
				s := stores[store](b, ns)
				locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 10 * time.Second})
				if err != nil {
					b.Fatal(err)
				}
				defer locker.Close(ctx)
				head, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("0")}, nil)
				if err != nil {
					b.Fatal(err)
				}
				lat := make([]time.Duration, 0, b.N)
				state := make([]byte, 2048)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					start := time.Now()
					var fence checkpoint.Fence
					var l lock.Lock
					if locked {
						if l, err = locker.Acquire(ctx, "thread-th"); err != nil {
							b.Fatal(err)
						}
						fence = l
					}
					copy(state, strconv.Itoa(i))
					if head, err = s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: head.ID, State: state}, fence); err != nil {
						b.Fatal(err)
					}
					if l != nil {
						_ = l.Release(ctx)
					}
					lat = append(lat, time.Since(start))
				}
				b.StopTimer()
				slices.Sort(lat)
				b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
				b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
			})
		}
	}
}
