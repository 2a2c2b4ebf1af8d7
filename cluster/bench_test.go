package cluster_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// BenchmarkEtcdCapacity measures what the embedded etcd (fsync on) commits
// on this machine, as a ceiling for everything built on it: 100-key put
// transactions with 1, 4 and 16 in flight, and transactions shaped like
// queue acknowledgements (30 tasks × 4 puts of 500 bytes, flat or each
// under a compare). b.N is the number of transactions per case.
func BenchmarkEtcdCapacity(b *testing.B) {
	s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	cli := s.Client(b)
	val := strings.Repeat("x", 500)
	for _, conc := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("puts100/inflight-%d", conc), func(b *testing.B) {
			txns(b, cli, conc, 100, func(g, i int) []clientv3.Op {
				ops := make([]clientv3.Op, 100)
				for k := range ops {
					ops[k] = clientv3.OpPut(fmt.Sprintf("/cap/%d/%d/%d/%d/%03d", conc, b.N, g, i, k), "v")
				}
				return ops
			})
		})
	}
	b.Run("ack-shaped/flat", func(b *testing.B) {
		txns(b, cli, 1, 120, func(g, i int) []clientv3.Op {
			var ops []clientv3.Op
			for k := range 30 {
				for j := range 4 {
					ops = append(ops, clientv3.OpPut(fmt.Sprintf("/flat/%d/%d/%d/%d", b.N, i, k, j), val))
				}
			}
			return ops
		})
	})
	b.Run("ack-shaped/nested", func(b *testing.B) {
		txns(b, cli, 1, 120, func(g, i int) []clientv3.Op {
			var ops []clientv3.Op
			for k := range 30 {
				var sub []clientv3.Op
				for j := range 4 {
					sub = append(sub, clientv3.OpPut(fmt.Sprintf("/nest/%d/%d/%d/%d", b.N, i, k, j), val))
				}
				ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(fmt.Sprintf("/nest/%d/%d/%d/0", b.N, i, k)), "=", 0)}, sub, nil))
			}
			return ops
		})
	})
}

// txns commits b.N transactions built by build, conc at a time, and reports
// key operations per second.
func txns(b *testing.B, cli *clientv3.Client, conc, keysPer int, build func(g, i int) []clientv3.Op) {
	ctx := context.Background()
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for g := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; i < b.N; i += conc {
				if _, err := cli.Txn(ctx).Then(build(g, i)...).Commit(); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N*keysPer)/time.Since(start).Seconds(), "keys/s")
	b.ReportMetric(0, "ns/op")
}
