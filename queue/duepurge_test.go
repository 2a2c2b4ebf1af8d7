package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// deletesOnly is a KV that refuses, as etcd under its NOSPACE alarm does,
// every request that puts a key.
type deletesOnly struct{ clientv3.KV }

func (d deletesOnly) Put(context.Context, string, string, ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	return nil, rpctypes.ErrNoSpace
}

func (d deletesOnly) Txn(ctx context.Context) clientv3.Txn {
	return &deletesOnlyTxn{Txn: d.KV.Txn(ctx)}
}

type deletesOnlyTxn struct {
	clientv3.Txn
	puts bool
}

func (t *deletesOnlyTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *deletesOnlyTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.puts = t.puts || hasPut(ops)
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *deletesOnlyTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.puts = t.puts || hasPut(ops)
	t.Txn = t.Txn.Else(ops...)
	return t
}
func (t *deletesOnlyTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.puts {
		return nil, rpctypes.ErrNoSpace
	}
	return t.Txn.Commit()
}

func hasPut(ops []clientv3.Op) bool {
	for _, op := range ops {
		if op.IsPut() {
			return true
		}
		if op.IsTxn() {
			_, then, els := op.Txn()
			if hasPut(then) || hasPut(els) {
				return true
			}
		}
	}
	return false
}

// TestPurgeScheduledDeletesSegmentsWhole: purging a queue's scheduled
// tasks deletes their segments whole (due key, record, index keys) with
// deletes only, so it works while etcd refuses every put; a task cancelled
// while scheduled keeps its record; deleting the queue works so too.
func TestPurgeScheduledDeletesSegmentsWhole(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	later := time.Now().Add(time.Hour)
	submitN(t, c, "ps", 5, func(tk *queue.Task) { tk.RunAt = later })
	submitN(t, c, "ps2", 70, func(tk *queue.Task) { tk.RunAt = later })
	if _, err := c.Cancel(ctx, "ps-0"); err != nil {
		t.Fatal(err)
	}
	full := srv.Client(t)
	full.KV = deletesOnly{full.KV}
	fc, err := queue.NewClient(full, ns)
	if err != nil {
		t.Fatal(err)
	}
	if n, err := fc.Purge(ctx, "ps", queue.Scheduled, nil, nil); err != nil || n != 4 {
		t.Fatalf("purge SCHEDULED with deletes only: %d purged (%v), want 4", n, err)
	}
	if st, err := c.Stats(ctx, "ps"); err != nil || st.Scheduled != 0 || st.Cancelled != 1 || st.Total() != 1 {
		t.Fatalf("stats after the purge: %+v (%v), want only the cancelled one", st, err)
	}
	if tk, err := c.Get(ctx, "ps-0"); err != nil || tk.CurrentStatus != queue.Cancelled {
		t.Fatalf("the task cancelled while scheduled: %+v (%v)", tk, err)
	}
	for _, id := range []string{"ps-1", "ps-4"} {
		if _, err := c.Get(ctx, id); err == nil {
			t.Fatalf("%s is still there after the purge", id)
		}
	}
	for _, pre := range []string{keys.Segments("ps"), keys.QueueDue("ps")} {
		if g, err := cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
			t.Fatalf("%d keys left under %s (%v)", g.Count, pre, err)
		}
	}
	if n, err := fc.DeleteQueue(ctx, "ps2", nil); err != nil || n != 70 {
		t.Fatalf("delete a queue of 70 scheduled tasks with deletes only: %d deleted (%v)", n, err)
	}
	if g, err := cli.Get(ctx, keys.Segments("ps2"), clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || g.Count != 0 {
		t.Fatalf("%d keys left of the deleted queue (%v)", g.Count, err)
	}
}
