package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestGuardOnTwoMembers: the guards of two members whose quotas differ (a
// small one on member 0, a large one on member 1) do not undo each other.
// Member 0's guard sets the store-full key once its file passes its
// high-water mark; member 1's guard, under its own low-water mark, leaves
// the key alone while member 0 is still past its mark; it used to delete
// it at once, and the two flapped.
func TestGuardOnTwoMembers(t *testing.T) {
	servers := startCluster(t, 8<<20, 1<<30)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	var logs etcdtest.LogBuffer
	guards := make([]*cluster.Guard, len(servers))
	clis := make([]*clientv3.Client, len(servers))
	for i, s := range servers {
		cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: s.Endpoints()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cli.Close() })
		clis[i] = cli
		guards[i] = etcdtest.NewGuard(t, cli, cluster.GuardConfig{
			Endpoint: s.Endpoints()[0], Quota: s.Quota(), Namespaces: []string{ns},
			HighWater: 0.1, LowWater: 0.05, Interval: time.Hour,
			Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		})
	}
	val := strings.Repeat("x", 100<<10)
	for i := 0; i < 10; i++ { // 1 MiB: past 10 % of member 0's quota, under 5 % of member 1's
		if _, err := clis[0].Put(ctx, fmt.Sprintf("/%s/fill/%03d", ns, i), val); err != nil {
			t.Fatal(err)
		}
	}
	// Member 0 may be the follower: it applies the writes, and its backend
	// commits them to its file, a little after the leader answered them.
	var st cluster.GuardStatus
	var err error
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if st, err = guards[0].Check(ctx); (err == nil && st.Full) || time.Now().After(deadline) {
			break
		}
	}
	if err != nil || !st.Full {
		t.Fatalf("member 0's guard at %d of %d bytes: full=%t, %v; logs:\n%s", st.Size, st.Quota, st.Full, err, logs.String())
	}
	st, err = guards[1].Check(ctx)
	if err != nil || st.InUse >= int64(0.05*float64(st.Quota)) {
		t.Fatalf("member 1's guard: %+v, %v", st, err)
	}
	if !exists(t, clis[1], keyspace.MustNew(ns).StoreFull()) {
		t.Fatalf("member 1's guard deleted the key that member 0's set, member 0 still past its mark; logs:\n%s", logs.String())
	}
}

// TestGuardCheckEndsWithoutQuorum: on a 3-member cluster that lost two
// members, the remaining member still answers its status, but the guard's
// next request (the guard keys, a linearizable read) cannot be served. The
// check must fail at the guard's own bound on each request (5 s), so that
// the guard tries again at its next interval. Without that bound it
// waited on etcd: here the member's own request timeout ends the read,
// but a member that stops answering after its status (a paused process, a
// stalled connection) would hold the check, and every later one, forever.
func TestGuardCheckEndsWithoutQuorum(t *testing.T) {
	servers := startCluster(t, 1<<30, 1<<30, 1<<30)
	ctx := context.Background()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: servers[0].Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	g := etcdtest.NewGuard(t, cli, cluster.GuardConfig{
		Endpoint: servers[0].Endpoints()[0], Quota: servers[0].Quota(),
		Namespaces: []string{etcdtest.Namespace(t)}, Interval: 100 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler),
	})
	if _, err := g.Check(ctx); err != nil {
		t.Fatalf("check with every member up: %v", err)
	}
	for _, s := range servers[1:] {
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
	done := make(chan error, 1)
	go func() { _, err := g.Check(ctx); done <- err }()
	select {
	case err := <-done:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("check without a quorum: %v, want the guard's own bound (context deadline exceeded)", err)
		}
	case <-time.After(3 * time.Minute): // the bound of a request: 5 s
		t.Fatal("check without a quorum has not ended in 3 minutes: a request of the guard is unbounded")
	}
}
