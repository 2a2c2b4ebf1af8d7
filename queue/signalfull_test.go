package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// A signal grows the store (an inbox key): while the store-full guard's
// key is set, a signal to a pending task, to a parked one (which it would
// wake) and to a named task is refused with the guard's StoreFullError,
// and nothing is written; the guard in the writes' own transaction
// refuses them too (the guard set after the look). Once cleared, the
// same signals are stored, and the parked task is woken.
func TestSignalRefusedWhenStoreFull(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	submitN(t, c, "sf", 2, nil)
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "sf", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	parked := ts[0].ID
	if rep, err := c.Report(ctx, []queue.Outcome{{Held: held("sf", ts[0], l), Wait: &task.Wait{Signals: []string{"go"}}}}); err != nil || rep[0].Err != nil {
		t.Fatal(rep, err)
	}
	pending := "sf-0"
	if parked == pending {
		pending = "sf-1"
	}
	// A named task: a checkpoint, no queue.
	if _, err := cli.Put(ctx, keys.TaskCheckpoint("named"), `{"task_id":"named","step":1}`); err != nil {
		t.Fatal(err)
	}
	if err := storeguard.Set(ctx, cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.7, LowWater: 0.6, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	before, _ := cli.Get(ctx, keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	for _, id := range []string{pending, parked, "named"} {
		_, err := c.Signal(ctx, id, "go", nil, "k")
		var sf *drover.StoreFullError
		if !errors.As(err, &sf) || sf.Quota != 10 {
			t.Fatalf("a signal to %s on a full store: %v; want its StoreFullError", id, err)
		}
	}
	put := []clientv3.Op{clientv3.OpPut(keys.TaskSignal(pending, "go", "k"), task.EncodeSignal(nil, time.Now()))}
	if err := c.WakeWith(ctx, pending, put); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("a signal's write on a full store: %v; want ErrStoreFull", err)
	}
	if err := c.SignalNamedWith(ctx, "named", []clientv3.Op{clientv3.OpPut(keys.TaskSignal("named", "go", "k"), "{}")}); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("a named task's signal write on a full store: %v; want ErrStoreFull", err)
	}
	after, _ := cli.Get(ctx, keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if after.Count != before.Count || before.Count == 0 {
		t.Fatalf("%d keys before the refused signals, %d after", before.Count, after.Count)
	}
	if got, _ := c.Get(ctx, parked); got.CurrentStatus != queue.Waiting {
		t.Fatalf("the parked task after a refused signal: %s; want WAITING", got.CurrentStatus)
	}
	if err := storeguard.Clear(ctx, cli, keys); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{pending, parked, "named"} {
		r, err := c.Signal(ctx, id, "go", nil, "k")
		if err != nil || !r.Stored || r.Woke != (id == parked) {
			t.Fatalf("a signal to %s once cleared: %+v, %v", id, r, err)
		}
	}
}

// On a full store, only a new signal is refused: a send again of one
// stored (to a pending task) or consumed (by a success's outcome), and of
// one to a named task, is answered stored false, writing nothing; a new
// signal to a finished task is refused as finished (ErrFinished), not as
// a full store.
func TestSignalStoreFullSendAgainAndFinished(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	submitN(t, c, "sfa", 2, nil)
	if _, err := cli.Put(ctx, keys.TaskCheckpoint("named"), `{"task_id":"named","step":1}`); err != nil {
		t.Fatal(err)
	}
	l := grantLease(t, cli, 30*time.Second)
	ts, err := c.Claim(ctx, "sfa", queue.ClaimRequest{Lease: l, Worker: "w", Max: 1})
	if err != nil || len(ts) != 1 {
		t.Fatal(len(ts), err)
	}
	done, pending := ts[0].ID, "sfa-0"
	if done == pending {
		pending = "sfa-1"
	}
	for _, id := range []string{done, pending, "named"} {
		if r, err := c.Signal(ctx, id, "go", nil, "k"); err != nil || !r.Stored {
			t.Fatal(id, r, err)
		}
	}
	rep, err := c.Report(ctx, []queue.Outcome{{Held: held("sfa", ts[0], l), Result: []byte(`1`), Received: []queue.SignalRef{{Name: "go", IdempotencyKey: "k"}}}})
	if err != nil || rep[0].Err != nil {
		t.Fatal(rep, err)
	}
	if err := storeguard.Set(ctx, cli, &drover.StoreFullError{Usage: 9, Quota: 10, HighWater: 0.7, LowWater: 0.6, Since: time.Now()}, keys); err != nil {
		t.Fatal(err)
	}
	before, _ := cli.Get(ctx, keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	for _, id := range []string{pending, "named"} {
		if r, err := c.Signal(ctx, id, "go", nil, "k"); err != nil || r.Stored || r.Woke {
			t.Fatalf("a send again to %s on a full store: %+v, %v; want stored false", id, r, err)
		}
	}
	for _, idem := range []string{"k", "new"} { // consumed, and new
		if _, err := c.Signal(ctx, done, "go", nil, idem); !errors.Is(err, queue.ErrFinished) {
			t.Fatalf("signal %s to the finished %s on a full store: %v; want ErrFinished", idem, done, err)
		}
	}
	if _, err := c.Signal(ctx, pending, "go", nil, "new"); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("a new signal on a full store: %v; want ErrStoreFull", err)
	}
	after, _ := cli.Get(ctx, keys.Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if after.Count != before.Count {
		t.Fatalf("%d keys before, %d after", before.Count, after.Count)
	}
}
