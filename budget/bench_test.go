package budget_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// BenchmarkReserveSettle measures one reservation and its settle through
// one client (its goroutines queue on the budget's mutex; one transaction
// each), and through four clients on their own connections that contend
// for the same budget (compare-and-swap conflicts, each retry one more
// transaction).
func BenchmarkReserveSettle(b *testing.B) {
	ctx := context.Background()
	for _, clients := range []int{1, 4} {
		name := map[int]string{1: "one-client", 4: "four-clients"}[clients]
		b.Run(name, func(b *testing.B) {
			ns := etcdtest.Namespace(b)
			cs := make([]*budget.Client, clients)
			for i := range cs {
				cs[i] = budget.New(srv.Client(b), ns)
				defer cs[i].Close()
			}
			if _, err := cs[0].Set(ctx, budget.Budget{Key: key, Tokens: budget.MaxTokens, WindowSeconds: budget.MaxWindowSeconds}); err != nil {
				b.Fatal(err)
			}
			var next int64
			b.SetParallelism(clients) // at least one goroutine per client (GOMAXPROCS 2 or more)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				c := cs[int(atomic.AddInt64(&next, 1))%clients]
				for pb.Next() {
					r, err := c.Reserve(ctx, key, "acme", 100)
					if err != nil {
						b.Error(err)
						return
					}
					if _, err := c.Settle(ctx, r, 90, nil); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
