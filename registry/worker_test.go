package registry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRegisterWhenFreeOnDeletion: an id held under a live lease of 60 s is
// registered as soon as the holder's key is deleted, through one wait that
// ends on the deletion, not on the lease's expiry; also when the holder's
// creation was compacted away before the wait began.
func TestRegisterWhenFreeOnDeletion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		compact bool
	}{{name: "deleted"}, {name: "deleted after a compaction", compact: true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cli := srv.Client(t)
			if tc.compact { // compactions stay in this test's etcd
				_, cli = etcdtest.StartOwn(t)
			}
			ns := etcdtest.Namespace(t)
			holder := start(t, cli, ns, process.WithTTL(60*time.Second))
			held := register(t, holder, registry.WorkerComponent, "w1", "")
			if tc.compact {
				var put *clientv3.PutResponse
				for range 2 { // compact past the revision after the creation
					var err error
					if put, err = cli.Put(ctx, ns+"/after", "x"); err != nil {
						t.Fatal(err)
					}
				}
				if _, err := cli.Compact(ctx, put.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
					t.Fatal(err)
				}
			}
			rt := start(t, cli, ns)
			decisions := make(chan string, 16)
			type result struct {
				reg *registry.Registration
				err error
			}
			done := make(chan result, 1)
			go func() {
				reg, err := registry.RegisterWhenFreeTraced(ctx, rt, registry.WorkerComponent, registry.Endpoint{ID: "w1", Address: "127.0.0.1:2"}, func(d string) { decisions <- d })
				done <- result{reg, err}
			}()
			next := func() string { // the next decision; fails if the call returned instead
				select {
				case d := <-decisions:
					return d
				case res := <-done:
					t.Fatalf("returned (%v) before its next decision", res.err)
				case <-ctx.Done():
					t.Fatal("no decision before the test's deadline")
				}
				return ""
			}
			if d := next(); d != "wait" {
				t.Fatalf("first decision %q, want wait", d)
			}
			if err := held.Deregister(ctx); err != nil {
				t.Fatal(err)
			}
			if d := next(); d != "deleted" {
				t.Fatalf("the wait ended with %q, want deleted", d)
			}
			res := <-done
			if res.err != nil {
				t.Fatal(res.err)
			}
			if res.reg.Lease().ID() != rt.Lease().ID() || res.reg.Endpoint().Address != "127.0.0.1:2" {
				t.Fatalf("registered under lease %x with %+v, want lease %x", int64(res.reg.Lease().ID()), res.reg.Endpoint(), int64(rt.Lease().ID()))
			}
			if len(decisions) != 0 {
				t.Fatalf("%d decisions more than one wait", len(decisions))
			}
		})
	}
}

// TestRegisterWhenFreeCancelled: a wait cut short by its context returns
// the duplicate it waited on and the context's error, both matchable.
func TestRegisterWhenFreeCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	holder := start(t, cli, ns, process.WithTTL(60*time.Second))
	register(t, holder, registry.WorkerComponent, "w1", "")
	rt := start(t, cli, ns)
	wctx, wcancel := context.WithCancel(ctx)
	decisions := make(chan string, 16)
	done := make(chan error, 1)
	go func() {
		_, err := registry.RegisterWhenFreeTraced(wctx, rt, registry.WorkerComponent, registry.Endpoint{ID: "w1", Address: "127.0.0.1:2"}, func(d string) { decisions <- d })
		done <- err
	}()
	select {
	case d := <-decisions:
		if d != "wait" {
			t.Fatalf("first decision %q, want wait", d)
		}
	case err := <-done:
		t.Fatalf("returned (%v) before waiting", err)
	case <-ctx.Done():
		t.Fatal("no decision before the test's deadline")
	}
	wcancel()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		t.Fatal("the cancelled wait did not return")
	}
	var de *registry.DuplicateError
	if !errors.As(err, &de) || !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled wait: %v, want a DuplicateError that wraps context.Canceled", err)
	}
}
