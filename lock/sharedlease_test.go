package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
)

func TestLockersSharingALease(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	shared, err := lease.Grant(ctx, cli, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close(ctx)
	a, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, Lease: shared, HolderID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, Lease: shared, HolderID: "b"})
	if err != nil {
		t.Fatal(err)
	}
	la, err := a.Acquire(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	lctx := la.Context()
	// b's failed attempts must not touch a's key, though both use one lease.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := b.Acquire(cancelled, "x"); err == nil {
		t.Fatal("acquire with a cancelled context succeeded")
	}
	if _, err := b.TryAcquire(ctx, "x"); !errors.Is(err, lock.ErrHeld) {
		t.Fatalf("b.TryAcquire: %v, want ErrHeld", err)
	}
	time.Sleep(100 * time.Millisecond)
	if lctx.Err() != nil {
		t.Fatalf("a's lock ended: %v", context.Cause(lctx))
	}
	if st, _ := a.Status(ctx, "x"); !st.Held || st.Token != la.Token() || st.Waiters != 0 {
		t.Fatalf("status %+v", st)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	_ = a.Close(ctx)
	_ = b.Close(ctx)
}
