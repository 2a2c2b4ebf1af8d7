package queue_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// rangeLog is a KV that notes where each plain read under prefix starts.
type rangeLog struct {
	clientv3.KV
	prefix string
	mu     sync.Mutex
	starts []string
}

func (r *rangeLog) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if strings.HasPrefix(key, r.prefix) {
		r.mu.Lock()
		r.starts = append(r.starts, key)
		r.mu.Unlock()
	}
	return r.KV.Get(ctx, key, opts...)
}

func (r *rangeLog) take() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.starts
	r.starts = nil
	return out
}

// TestExternalClaimsReadTheDueIndexFromWhereTheyLeft: the claims of a
// server (external claims) that moved a queue's scheduled segments up to a
// time read its due index from there (less a second) the next time, not
// from its first key, which etcd counts with every key moved since the
// last compaction.
func TestExternalClaimsReadTheDueIndexFromWhereTheyLeft(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys, err := keyspace.New(ns)
	if err != nil {
		t.Fatal(err)
	}
	pre := keys.QueueDue("dq")
	log := &rangeLog{KV: cli.KV, prefix: pre}
	cli.KV = log
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now().UTC().Truncate(time.Second)
	clk := &fakeClock{t: t0}
	queue.SetClock(c, clk.now)
	submitN(t, c, "dq", 3, func(tk *queue.Task) { tk.RunAt = t0.Add(time.Minute) })
	l := grantLease(t, cli, 30*time.Second)
	claim := func() int {
		t.Helper()
		// Claims move due items at most every 250 ms: wait that out.
		time.Sleep(300 * time.Millisecond)
		ts, err := c.Claim(ctx, "dq", queue.ClaimRequest{Lease: l, Worker: "w", Max: 10})
		if err != nil {
			t.Fatal(err)
		}
		return len(ts)
	}
	if n := claim(); n != 0 {
		t.Fatalf("claimed %d tasks before their time", n)
	}
	clk.set(t0.Add(2 * time.Minute))
	if n := claim(); n != 3 {
		t.Fatalf("claimed %d tasks once due, want 3", n)
	}
	log.take()
	claim()
	bound := keyspace.TimeBound(pre, t0.Add(2*time.Minute-time.Second).UnixNano())
	starts := log.take()
	if len(starts) == 0 {
		t.Fatal("the claim did not read the due index")
	}
	for _, s := range starts {
		if s < bound {
			t.Fatalf("a claim read the due index from %q, before where the last move left it (%q)", s, bound)
		}
	}
}
