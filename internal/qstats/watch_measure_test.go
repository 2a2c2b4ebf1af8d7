package qstats

import (
	"context"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// watchTally counts what a watch delivered.
type watchTally struct {
	events, deletes, bytes int // bytes: keys and values
	sawEnd                 bool
}

// TestWatchTrafficMeasure (DROVER_BENCH_WATCH=1) runs a workload of 2,400
// tasks and counts the events and bytes the recorder's watch receives,
// beside the same watch with deletions: docs/bench-log/queue.md.
func TestWatchTrafficMeasure(t *testing.T) {
	if os.Getenv("DROVER_BENCH_WATCH") == "" {
		t.Skip("a measurement: DROVER_BENCH_WATCH=1")
	}
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	end := keys.QueueHistory() + "end-of-measure"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rev, err := cli.Get(ctx, end)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	tally := map[string]*watchTally{}
	watch := func(name string, opts []clientv3.OpOption) {
		tl := &watchTally{}
		tally[name] = tl
		ch := cli.Watch(ctx, keys.QueueHistory(), opts...)
		wg.Go(func() {
			for wr := range ch {
				mu.Lock()
				for _, ev := range wr.Events {
					tl.events++
					tl.bytes += len(ev.Kv.Key) + len(ev.Kv.Value)
					if ev.Type == mvccpb.DELETE {
						tl.deletes++
					}
					tl.sawEnd = tl.sawEnd || string(ev.Kv.Key) == end
				}
				mu.Unlock()
			}
		})
	}
	from := rev.Header.Revision + 1
	watch("recorder", watchOptions(keys, from))
	watch("with deletions", []clientv3.OpOption{clientv3.WithRange(keys.QueueWatchEnd()), clientv3.WithRev(from), clientv3.WithProgressNotify()})
	workload{ok: 2000, dead: 100, flaky: 200, held: 100}.run(t, cli, ns, "emails", "wm")
	if _, err := cli.Put(ctx, end, "x"); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(30*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return tally["recorder"].sawEnd && tally["with deletions"].sawEnd
	}) {
		t.Fatal("the watches did not reach the end")
	}
	cancel()
	wg.Wait()
	for name, tl := range tally {
		t.Logf("%s: %d events (%d deletions), %d bytes of keys and values", name, tl.events, tl.deletes, tl.bytes)
	}
}
