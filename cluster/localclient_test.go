package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestLocalClientWatchRequiresLeader: on a member that lost its leader (the
// other of two members stopped), a watch of its in-process client that
// requires a leader ends within a few election timeouts, as a gRPC client's
// does, and a new one is refused at once; a watch that does not require
// one stays open. Reads and writes on a member that has one go through.
func TestLocalClientWatchRequiresLeader(t *testing.T) {
	servers := startCluster(t, 1<<30, 1<<30)
	cli := servers[0].LocalClient()
	defer cli.Close()
	ns := etcdtest.Namespace(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := cli.Put(ctx, "/"+ns+"/k", "v"); err != nil {
		t.Fatal(err)
	}
	if r, err := cli.Get(ctx, "/"+ns+"/k"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("get: %v %v", r, err)
	}
	needs := cli.Watch(clientv3.WithRequireLeader(ctx), "/"+ns+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	plain := cli.Watch(ctx, "/"+ns+"/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	for _, ch := range []clientv3.WatchChan{needs, plain} {
		if wr := <-ch; !wr.Created {
			t.Fatalf("first answer of a watch: %+v", wr)
		}
	}
	// An event goes through the leader-watching watch.
	if _, err := cli.Put(ctx, "/"+ns+"/k2", "v"); err != nil {
		t.Fatal(err)
	}
	if wr := <-needs; len(wr.Events) != 1 {
		t.Fatalf("event: %+v", wr)
	}
	<-plain

	servers[1].Close() // no quorum: member 0 loses its leader
	start := time.Now()
	timeout := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case _, ok := <-needs:
			done = !ok
		case <-timeout:
			t.Fatal("the watch that requires a leader is still open 30 s after the member lost it")
		}
	}
	t.Logf("the watch that requires a leader ended %s after the other member stopped", time.Since(start).Round(time.Millisecond))
	select {
	case _, ok := <-plain:
		if !ok {
			t.Fatal("the watch that does not require a leader ended too")
		}
	default:
	}
	refused := cli.Watch(clientv3.WithRequireLeader(ctx), "/"+ns+"/", clientv3.WithPrefix())
	select {
	case _, ok := <-refused:
		if ok {
			t.Fatal("a watch that requires a leader, opened without one, answered")
		}
	case <-time.After(time.Second):
		t.Fatal("a watch that requires a leader, opened without one, was not refused at once")
	}
}
