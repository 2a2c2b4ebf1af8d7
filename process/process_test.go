package process_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLeaseLossCancelsRuntime stops etcd under a running runtime: its root
// context must be cancelled with the lease loss as cause no later than the
// lease's deadline (+ scheduling slack), every goroutine it started must
// end, and Shutdown must return promptly.
func TestLeaseLossCancelsRuntime(t *testing.T) {
	own, cli := etcdtest.StartOwn(t)
	const ttl = 2 * time.Second
	rt, err := process.Start(context.Background(), cli, process.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	var ended atomic.Int32
	for range 3 {
		if err := rt.Go(func(ctx context.Context) {
			<-ctx.Done()
			ended.Add(1)
		}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(ttl / 2)
	deadline := rt.Lease().Deadline()
	own.Stop()
	select {
	case <-rt.Done():
	case <-time.After(2 * ttl):
		t.Fatalf("runtime still running %s after etcd stopped", 2*ttl)
	}
	if late := time.Since(deadline); late > 300*time.Millisecond {
		t.Fatalf("root context cancelled %s after the lease deadline", late)
	}
	if !errors.Is(rt.Err(), lease.ErrLost) {
		t.Fatalf("cause %v, want lease.ErrLost", rt.Err())
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := rt.Shutdown(ctx); err != nil {
		t.Fatalf("shutdown after lease loss: %v", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("shutdown took %s with etcd down", took)
	}
	if ended.Load() != 3 {
		t.Fatalf("%d of 3 goroutines ended", ended.Load())
	}
	if err := rt.Go(func(context.Context) {}); !errors.Is(err, process.ErrShutdown) {
		t.Fatalf("Go after shutdown: %v", err)
	}
}

// TestShutdownRevokesAndWaits: Shutdown waits for goroutines, and revoking
// the lease deletes what was bound to it at once.
func TestShutdownRevokesAndWaits(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	rt, err := process.Start(ctx, cli, process.WithNamespace(etcdtest.Namespace(t)))
	if err != nil {
		t.Fatal(err)
	}
	key := "/" + etcdtest.Namespace(t) + "/bound"
	if _, err := cli.Put(ctx, key, "x", clientv3.WithLease(rt.Lease().ID())); err != nil {
		t.Fatal(err)
	}
	var finished atomic.Bool
	_ = rt.Go(func(ctx context.Context) {
		<-ctx.Done()
		time.Sleep(200 * time.Millisecond) // graceful work after cancellation
		finished.Store(true)
	})
	if err := rt.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if !finished.Load() {
		t.Fatal("Shutdown returned before its goroutine finished")
	}
	if !errors.Is(rt.Err(), process.ErrShutdown) {
		t.Fatalf("cause %v", rt.Err())
	}
	g, err := cli.Get(ctx, key)
	if err != nil || len(g.Kvs) != 0 {
		t.Fatalf("key bound to the primary lease survived Shutdown: %v %v", g, err)
	}
	// Bounded: a goroutine that ignores its context does not hold Shutdown.
	rt2, err := process.Start(ctx, cli)
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	_ = rt2.Go(func(context.Context) { <-release })
	sctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := rt2.Shutdown(sctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("shutdown with a stuck goroutine: %v", err)
	}
	if r, err := cli.TimeToLive(ctx, rt2.Lease().ID()); err != nil || r.TTL != -1 {
		t.Fatalf("lease not revoked after a timed-out shutdown: %+v %v", r, err)
	}
}

// TestReRegisterSurvivesLeaseLoss revokes a WithReRegister runtime's lease
// behind its back: the root context stays alive and a new lease replaces the
// old one.
func TestReRegisterSurvivesLeaseLoss(t *testing.T) {
	t.Parallel()
	cli := srv.Client(t)
	ctx := context.Background()
	rt, err := process.Start(ctx, cli, process.WithTTL(2*time.Second), process.WithReRegister())
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Shutdown(ctx)
	old := rt.Lease()
	if _, err := cli.Revoke(ctx, old.ID()); err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nl, err := rt.NextLease(wctx, old)
	if err != nil {
		t.Fatalf("no new lease after the old one was revoked: %v", err)
	}
	if nl.ID() == old.ID() || nl.Err() != nil {
		t.Fatalf("new lease %x (err %v), old %x", int64(nl.ID()), nl.Err(), int64(old.ID()))
	}
	if rt.Err() != nil {
		t.Fatalf("runtime stopped: %v", rt.Err())
	}
}

// A runtime's root context ends when its primary lease is lost; bind
// registrations and work to it.
func ExampleStart() {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.ClientURL()}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer cli.Close()
	rt, err := process.Start(context.Background(), cli, process.WithTTL(10*time.Second))
	if err != nil {
		fmt.Println(err)
		return
	}
	_ = rt.Go(func(ctx context.Context) {
		<-ctx.Done() // serve until shutdown or lease loss
	})
	fmt.Println(rt.Shutdown(context.Background()))
	// Output: <nil>
}
