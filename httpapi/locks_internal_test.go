package httpapi

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// TestLockGrantedAfterCallerLeftIsLetGo: when etcd grants a lock after
// the request's context ended (a batch sent for several callers ends on
// its own), nobody learns its token and contender, so the server lets it
// go rather than leave it held: the answer is an error, the lock is free
// and the owner lock's own lease is revoked. The request's context is
// cancelled by the etcd client itself, right after the acquisition's
// transaction answered.
func TestLockGrantedAfterCallerLeftIsLetGo(t *testing.T) {
	t.Parallel()
	srv, plain := etcdtest.StartOwn(t)
	var armed atomic.Pointer[context.CancelFunc]
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: srv.Endpoints(), DialTimeout: 30 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			err := invoker(ctx, method, req, reply, cc, opts...)
			if method == "/etcdserverpb.KV/Txn" && err == nil {
				if c := armed.Swap(nil); c != nil {
					(*c)()
				}
			}
			return err
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	s, err := New(Config{Etcd: cli, Namespace: etcdtest.Namespace(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	armed.Store(&cancel)
	in := &acquireInput{Name: "late"}
	in.Body.Owner, in.Body.TTL = "worker-7", 60
	if out, err := s.acquireLock(ctx, in); err == nil {
		t.Fatalf("acquired after the caller left: %+v; want an error", out.Body)
	}
	if armed.Load() != nil {
		t.Fatal("the acquisition sent no transaction")
	}
	check, done := context.WithTimeout(context.Background(), 30*time.Second)
	defer done()
	g, err := plain.Get(check, s.keys(ctx).Lock("late"), clientv3.WithPrefix())
	if err != nil || len(g.Kvs) != 0 {
		t.Fatalf("the lock after the caller left: %v, %d keys; want it free", err, len(g.Kvs))
	}
	leases, err := plain.Leases(check)
	if err != nil || len(leases.Leases) != 0 {
		t.Fatalf("leases after the caller left: %v, %v; want the owner lock's revoked", err, leases.Leases)
	}
}
