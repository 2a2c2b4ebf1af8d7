package queue

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// takeWithin waits up to d for what wt has: its events and whether it
// missed some; ok is false when nothing came.
func takeWithin(wt *queueWait, d time.Duration) (keys []string, missed, ok bool) {
	select {
	case <-wt.C():
	case <-time.After(d):
		return nil, false, false
	}
	evs, missed := wt.Take()
	for _, ev := range evs {
		keys = append(keys, string(ev.Kv.Key))
	}
	return keys, missed, true
}

// TestSharedWatch: a wait sees the queue's events after its revision:
// those that came before it started from the watch's history, later ones
// as they commit; none at or before its revision; a wait older than the
// watch, or than its history, is told it missed events; and when the etcd
// client closes, the watch ends and its waits are woken.
func TestSharedWatch(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	c, err := NewClient(cli, etcdtest.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	put := func(k string) int64 {
		t.Helper()
		r, err := cli.Put(ctx, c.keys.Queue("q")+k, "v")
		if err != nil {
			t.Fatal(err)
		}
		return r.Header.Revision
	}
	before := put("/x/before")
	put("/x/gap") // the wait must see it, and the watch opens after it
	first := c.waitAfter("q", before)
	if _, missed, ok := takeWithin(first, 5*time.Second); !ok || !missed {
		t.Fatalf("a wait from before the watch opened: missed %v (signalled %v); want it told it may have missed events", missed, ok)
	}
	first.Stop()
	probe := c.waitAfter("q", 0)
	r1 := put("/x/one")
	if keys, missed, ok := takeWithin(probe, 5*time.Second); !ok || missed || len(keys) != 1 {
		t.Fatalf("a wait from the current revision got %v (missed %v, signalled %v); want /x/one", keys, missed, ok)
	}
	probe.Stop()
	r2 := put("/x/two")
	time.Sleep(100 * time.Millisecond) // the watch has sent both
	late := c.waitAfter("q", r1-1)
	keys, missed, ok := takeWithin(late, time.Second)
	if !ok || missed || len(keys) != 2 || keys[0] != c.keys.Queue("q")+"/x/one" {
		t.Fatalf("a wait from before two events got %v (missed %v, signalled %v); want both from the history", keys, missed, ok)
	}
	late.Stop()
	current := c.waitAfter("q", r2)
	if keys, missed, ok := takeWithin(current, 200*time.Millisecond); ok {
		t.Fatalf("a wait from the last revision got %v (missed %v); want nothing", keys, missed)
	}
	began := time.Now()
	put("/x/three")
	if keys, _, ok := takeWithin(current, 5*time.Second); !ok || len(keys) != 1 {
		t.Fatalf("a waiting wait got %v (signalled %v); want /x/three", keys, ok)
	}
	t.Logf("an event reached a waiting wait in %v", time.Since(began).Round(time.Microsecond))
	current.Stop()
	// Past the history: 2*watchHistory+256 more events, 128 a request.
	for i := 0; i < (2*watchHistory+256)/128; i++ {
		ops := make([]clientv3.Op, 128)
		for k := range ops {
			ops[k] = clientv3.OpPut(fmt.Sprintf("%s/h/%d-%d", c.keys.Queue("q"), i, k), "v")
		}
		if _, err := cli.Txn(ctx).Then(ops...).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(200 * time.Millisecond)
	old := c.waitAfter("q", r2)
	if _, missed, ok := takeWithin(old, time.Second); !ok || !missed {
		t.Fatalf("a wait older than the history: missed %v (signalled %v); want missed", missed, ok)
	}
	old.Stop()
	open := c.waitAfter("q", 0)
	cli.Close()
	if _, missed, ok := takeWithin(open, 5*time.Second); !ok || !missed {
		t.Fatalf("a wait when the client closed: missed %v (signalled %v); want woken", missed, ok)
	}
	open.Stop()
}

// TestClientClose: Close stops the shared watches, whose waits are woken
// (they may have missed events), and waits for their goroutines; a second
// Close, and two at once, return nil; a wait started after Close is served
// by no watch and opens none.
func TestClientClose(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	c, err := NewClient(cli, etcdtest.Namespace(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	a, b := c.waitAfter("a", 0), c.waitAfter("b", 0)
	defer a.Stop()
	defer b.Stop()
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- c.Close(ctx) }()
	}
	for range 2 {
		if err := <-done; err != nil {
			t.Fatalf("close: %v", err)
		}
	}
	if err := c.Close(ctx); err != nil {
		t.Fatalf("a second close: %v", err)
	}
	for _, wt := range []*queueWait{a, b} {
		if _, missed, ok := takeWithin(wt, 5*time.Second); !ok || !missed {
			t.Fatalf("a wait of a closed client: missed %v (signalled %v); want it woken", missed, ok)
		}
	}
	c.watches.mu.Lock()
	n := len(c.watches.queues)
	c.watches.mu.Unlock()
	if n != 0 {
		t.Fatalf("%d watches left after close", n)
	}
	late := c.waitAfter("a", 0)
	defer late.Stop()
	if _, err := cli.Put(ctx, c.keys.Queue("a")+"/x", "v"); err != nil {
		t.Fatal(err)
	}
	if _, _, ok := takeWithin(late, 200*time.Millisecond); ok {
		t.Fatal("a wait started after close was signalled")
	}
	c.watches.mu.Lock()
	n = len(c.watches.queues)
	c.watches.mu.Unlock()
	if n != 0 {
		t.Fatal("a wait started after close opened a watch")
	}
}

// A Close whose watches have stopped reports no error even when its
// context has ended too (a select between two ready cases would pick
// either); a client with no watch at all likewise.
func TestClientCloseAfterTheEndWithAnEndedContext(t *testing.T) {
	_, cli := etcdtest.StartOwn(t)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for i := range 100 {
		c, err := NewClient(cli, etcdtest.Namespace(t))
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(ended); err != nil {
			t.Fatalf("try %d: close of a client with no watch: %v", i, err)
		}
		if err := c.Close(ended); err != nil {
			t.Fatalf("try %d: a second close: %v", i, err)
		}
	}
}
