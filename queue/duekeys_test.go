package queue_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDueKeyCountsItsTasks: a scheduled segment's due key carries its
// number of tasks in its name, so that counting scheduled tasks reads keys
// only; a due key written before (the count in its value only) is still
// counted, listed, read and moved when due.
func TestDueKeyCountsItsTasks(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	submitN(t, c, "dk", 3, func(tk *queue.Task) { tk.RunAt = t0.Add(time.Hour) })
	g, err := cli.Get(ctx, keys.QueueDue("dk"), clientv3.WithPrefix())
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("due keys: %v (%v), want one", g.Kvs, err)
	}
	key := string(g.Kvs[0].Key)
	if !strings.HasSuffix(key, "-3") {
		t.Fatalf("due key %q does not end in its count of tasks (-3)", key)
	}
	// The same segment as an older server wrote it: the count in the
	// value only.
	old := strings.TrimSuffix(key, "-3")
	if _, err := cli.Txn(ctx).Then(clientv3.OpDelete(key), clientv3.OpPut(old, "3")).Commit(); err != nil {
		t.Fatal(err)
	}
	submitN(t, c, "dk2", 2, func(tk *queue.Task) { tk.RunAt = t0.Add(time.Hour) })
	if st, err := c.Stats(ctx, "dk"); err != nil || st.Scheduled != 3 || st.Pending != 0 {
		t.Fatalf("stats with an old due key: %+v (%v), want 3 scheduled", st, err)
	}
	if st, err := c.Stats(ctx, "dk2"); err != nil || st.Scheduled != 2 {
		t.Fatalf("stats: %+v (%v), want 2 scheduled", st, err)
	}
	for _, q := range []string{"dk", "dk2"} {
		page, err := c.List(ctx, q, queue.Scheduled, queue.ListOptions{Limit: 10})
		if err != nil || len(page.Tasks) != map[string]int{"dk": 3, "dk2": 2}[q] {
			t.Fatalf("list SCHEDULED of %s: %d tasks (%v)", q, len(page.Tasks), err)
		}
	}
	if tk, err := c.Get(ctx, "dk-1"); err != nil || tk.CurrentStatus != queue.Scheduled {
		t.Fatalf("get dk-1: %+v (%v), want SCHEDULED", tk, err)
	}
	clk.set(t0.Add(2 * time.Hour))
	for _, q := range []string{"dk", "dk2"} {
		if n, err := queue.PromoteScheduled(ctx, c, q); err != nil || n != 1 {
			t.Fatalf("promote %s: moved %d (%v), want its one segment", q, n, err)
		}
		ts, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: grantLease(t, cli, 10*time.Second), Worker: "w", Max: 10})
		if err != nil || len(ts) != map[string]int{"dk": 3, "dk2": 2}[q] {
			t.Fatalf("claim %s once due: %d tasks (%v)", q, len(ts), err)
		}
	}
}

// TestStatsReadsTheDueIndexOnlyWhenChanged: Stats reads the due index's
// keys only when its version key changed since the last Stats of this
// Client (every submission of scheduled tasks, move and purge changes
// it): a key put under the index without that change is not read, and is
// once the version changes.
func TestStatsReadsTheDueIndexOnlyWhenChanged(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	keys := keyspace.MustNew(ns)
	later := time.Now().Add(time.Hour)
	submitN(t, c, "sv", 3, func(tk *queue.Task) { tk.RunAt = later })
	if st, err := c.Stats(ctx, "sv"); err != nil || st.Scheduled != 3 {
		t.Fatalf("stats: %+v (%v), want 3 scheduled", st, err)
	}
	g, err := cli.Get(ctx, keys.QueueDue("sv"), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("due keys: %v (%v)", g.Kvs, err)
	}
	// A copy of the key, 5 tasks in its name, as no writer puts it.
	seg := strings.TrimSuffix(string(g.Kvs[0].Key), "-3")
	if _, err := cli.Put(ctx, seg[:len(seg)-1]+"f-5", "5"); err != nil {
		t.Fatal(err)
	}
	if st, _ := c.Stats(ctx, "sv"); st.Scheduled != 3 {
		t.Fatalf("stats with the index's version unchanged: %d scheduled, want 3 (the index not read again)", st.Scheduled)
	}
	submitN(t, c, "sv", 1, func(tk *queue.Task) { tk.ID, tk.RunAt = "sv-x", later.Add(time.Minute) })
	if st, _ := c.Stats(ctx, "sv"); st.Scheduled != 3+5+1 {
		t.Fatalf("stats once the index changed: %d scheduled, want 9 (read again)", st.Scheduled)
	}
}
