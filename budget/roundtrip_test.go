package budget_test

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// countKV counts the round trips a client makes to etcd's key-value API.
type countKV struct {
	clientv3.KV
	n atomic.Int64
}

func (k *countKV) Txn(ctx context.Context) clientv3.Txn { k.n.Add(1); return k.KV.Txn(ctx) }
func (k *countKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.n.Add(1)
	return k.KV.Get(ctx, key, opts...)
}
func (k *countKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.n.Add(1)
	return k.KV.Put(ctx, key, val, opts...)
}

// TestOneTransactionEach: a worker that is the budget's only writer
// reserves and settles with one transaction each; when another wrote in
// between, the next call takes one more (its failed compare-and-swap
// brings the fresh read).
func TestOneTransactionEach(t *testing.T) {
	ctx := context.Background()
	clk := newFakeClock()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	kv := &countKV{KV: cli.KV}
	cli.KV = kv
	c := budget.New(cli, ns, budget.WithClock(clk.Now))
	defer c.Close()
	if _, err := c.Set(ctx, budget.Budget{Key: key, Tokens: 1_000_000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	pair := func(c *budget.Client) {
		t.Helper()
		r, err := c.Reserve(ctx, key, "acme", 100)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Settle(ctx, r, 90, nil); err != nil {
			t.Fatal(err)
		}
	}
	pair(c) // the first call reads the budget
	kv.n.Store(0)
	for range 20 {
		pair(c)
	}
	if n := kv.n.Load(); n != 40 {
		t.Fatalf("20 reservations and settles took %d round trips, want 40", n)
	}
	other := budget.New(srv.Client(t), ns, budget.WithClock(clk.Now))
	defer other.Close()
	pair(other)
	kv.n.Store(0)
	pair(c)
	if n := kv.n.Load(); n != 3 {
		t.Fatalf("a reservation and settle after another writer took %d round trips, want 3", n)
	}
}
