package queue_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// countingClient is a client of the test etcd that counts its unary calls:
// etcd's round trips.
func countingClient(t *testing.T) (*clientv3.Client, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	count := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		n.Add(1)
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: srv.Endpoints(), DialTimeout: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(count)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, &n
}

// TestClaimFillsAcrossSegments: one claim with max 10 takes the 4 pending
// tasks of two segments (two submissions), not one segment's only; and a
// claim a segment fills costs no more round trips than before.
func TestClaimFillsAcrossSegments(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli, trips := countingClient(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	for s := range 2 {
		ts := []queue.Task{{ID: fmt.Sprintf("s%d-a", s), Type: "x"}, {ID: fmt.Sprintf("s%d-b", s), Type: "x"}}
		if res, err := c.Submit(ctx, "fill", ts, nil); err != nil || res.Submitted != 2 {
			t.Fatalf("submit segment %d: %+v %v", s, res, err)
		}
	}
	l := grantLease(t, cli, 30*time.Second)
	before := trips.Load()
	got, err := c.Claim(ctx, "fill", queue.ClaimRequest{Lease: l, Worker: "w", Max: 10})
	if err != nil || len(got) != 4 {
		t.Fatalf("claim with max 10 of 4 pending tasks in 2 segments: %d tasks, err %v", len(got), err)
	}
	seen := map[string]bool{}
	for _, tk := range got {
		if seen[tk.ID] || tk.CurrentStatus != queue.Running || tk.Token == 0 {
			t.Fatalf("claimed twice or not running: %+v", tk)
		}
		seen[tk.ID] = true
	}
	t.Logf("a claim of 4 tasks in 2 segments: %d etcd round trips", trips.Load()-before)

	// Nothing is left: another session's claim gets none.
	l2 := grantLease(t, cli, 30*time.Second)
	if more, err := c.Claim(ctx, "fill", queue.ClaimRequest{Lease: l2, Worker: "w2", Max: 10}); err != nil || len(more) != 0 {
		t.Fatalf("a second claim: %d tasks, err %v; want none", len(more), err)
	}
}
