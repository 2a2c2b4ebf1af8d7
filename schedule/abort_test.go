package schedule_test

import (
	"context"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/schedule"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestAbortLeavesTheItem holds what a fire that cannot read its schedule
// relies on: the index's request fails and the item stays.
func TestAbortLeavesTheItem(t *testing.T) {
	cli := srv.Client(t)
	prefix := "/" + etcdtest.Namespace(t) + "/due/"
	ctx := context.Background()
	key := due.Key(prefix, time.Now().Add(-time.Second), "x")
	if _, err := cli.Put(ctx, key, "v"); err != nil {
		t.Fatal(err)
	}
	ix := &due.Index{Client: cli, Prefix: prefix, Move: func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
		return schedule.Abort(kv), true
	}}
	if _, _, err := ix.Promote(ctx); err == nil {
		t.Fatal("promote with an aborted move succeeded")
	}
	if g, err := cli.Get(ctx, key); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("item after an aborted move: %v %v", g, err)
	}
}
