package schedule_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
)

// offsetClock is the real time shifted by an offset the test moves.
type offsetClock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *offsetClock) now() time.Time                  { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.off) }
func (c *offsetClock) add(d time.Duration)             { c.mu.Lock(); c.off += d; c.mu.Unlock() }
func (c *offsetClock) set(to time.Time)                { c.mu.Lock(); c.off = time.Until(to); c.mu.Unlock() }
func (c *offsetClock) since(t time.Time) time.Duration { return t.Sub(c.now()) }

// TestHeldTickBacksOff: a tick that buffer-one holds is tried again after
// 1s, 2s, 4s...: its record is not rewritten each second.
func TestHeldTickBacksOff(t *testing.T) {
	cli := srv.Client(t)
	ns := etcdtest.Namespace(t)
	ck := &offsetClock{}
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: ns, Now: ck.now})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	s, err := c.Create(ctx, schedule.Schedule{Name: "b", Every: queue.Duration(time.Hour), Queue: "q", Type: "t", Overlap: schedule.BufferOne})
	if err != nil {
		t.Fatal(err)
	}
	ck.set(s.NextFireAt)
	r := &schedule.Runner{Client: c}
	r.Start(ctx)
	waitHistory(t, c, "b", 1) // its task stays PENDING: no worker
	r.Stop()
	ck.add(time.Hour) // the next tick is due, and held
	r = &schedule.Runner{Client: c}
	r.Start(ctx)
	defer r.Stop()
	var wait time.Duration
	if !etcdtest.Eventually(60*time.Second, func() bool {
		got, err := c.Get(ctx, "b")
		wait = ck.since(got.NextFireAt)
		return err == nil && wait > 3500*time.Millisecond
	}) {
		t.Fatalf("held tick tried again in %s, not backing off", wait)
	}
	ks, _ := keyspace.New(ns)
	g, err := cli.Get(ctx, ks.Schedule("b"))
	if err != nil || len(g.Kvs) != 1 {
		t.Fatal(err)
	}
	if v := g.Kvs[0].Version; v > 8 {
		t.Fatalf("record written %d times to reach a 4s backoff", v)
	}
}
