package storeguard_test

import (
	"context"
	"errors"
	"os"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

var srv *etcdtest.Server

func TestMain(m *testing.M) {
	os.Exit(etcdtest.Main(m, &srv, "", nil))
}

// TestGuardKey: a transaction with NotFull writes while the key is absent
// and not while it exists, and then its Else branch's GetOp tells why;
// FullError and FromRange return the stored error; Set and Clear cover
// every namespace given, and no other.
func TestGuardKey(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	a, b, other := keyspace.MustNew(etcdtest.Namespace(t)), keyspace.MustNew(etcdtest.Namespace(t)), keyspace.MustNew(etcdtest.Namespace(t))
	if a.StoreFull() != a.Root()+"store/full" {
		t.Fatalf("guard key %s, want %sstore/full", a.StoreFull(), a.Root())
	}
	write := func(v string) (*clientv3.TxnResponse, error) {
		return cli.Txn(ctx).If(storeguard.NotFull(a)).Then(clientv3.OpPut(a.Root()+"data", v)).Else(storeguard.GetOp(a)).Commit()
	}
	if r, err := write("1"); err != nil || !r.Succeeded {
		t.Fatalf("write with no guard key: %v, %v", r, err)
	}
	if err := storeguard.FullError(ctx, cli, a); err != nil {
		t.Fatalf("FullError with no guard key: %v", err)
	}

	full := &drover.StoreFullError{Usage: 45 << 20, Quota: 64 << 20, HighWater: 0.7, LowWater: 0.6}
	if err := storeguard.Set(ctx, cli, full, a, b); err != nil {
		t.Fatal(err)
	}
	r, err := write("2")
	if err != nil || r.Succeeded {
		t.Fatalf("write with the guard key: %v, %v; want refused", r, err)
	}
	for what, err := range map[string]error{
		"FromRange":   storeguard.FromRange(r.Responses[0].GetResponseRange()),
		"FullError":   storeguard.FullError(ctx, cli, a),
		"FullError b": storeguard.FullError(ctx, cli, b),
	} {
		var sf *drover.StoreFullError
		if !errors.As(err, &sf) || *sf != *full || !errors.Is(err, drover.ErrStoreFull) {
			t.Fatalf("%s: %v, want %+v", what, err, full)
		}
	}
	if err := storeguard.FullError(ctx, cli, other); err != nil {
		t.Fatalf("a namespace not set: %v", err)
	}
	if g, _ := cli.Get(ctx, a.Root()+"data"); string(g.Kvs[0].Value) != "1" {
		t.Fatalf("the refused write wrote %q", g.Kvs[0].Value)
	}

	if err := storeguard.Clear(ctx, cli, a, b); err != nil {
		t.Fatal(err)
	}
	if r, err := write("3"); err != nil || !r.Succeeded {
		t.Fatalf("write once cleared: %v, %v", r, err)
	}
	if err := storeguard.FullError(ctx, cli, b); err != nil {
		t.Fatalf("b once cleared: %v", err)
	}
	if storeguard.FromRange(nil) != nil {
		t.Fatal("FromRange(nil) is an error")
	}
}

// TestUnreadableGuardValue: a guard key that does not hold the guard's JSON
// still refuses, with an error matching ErrStoreFull.
func TestUnreadableGuardValue(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	if _, err := cli.Put(ctx, keys.StoreFull(), "full"); err != nil {
		t.Fatal(err)
	}
	if err := storeguard.FullError(ctx, cli, keys); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("FullError of an unreadable value: %v", err)
	}
}
