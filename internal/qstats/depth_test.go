package qstats

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
)

// A queue whose depth does not change gets a record at least hourly all
// the same: when its last record's lease ends, the depth is still there.
func TestDepthOutlivesItsRecordsLease(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	depth := func() map[string]Depth { return map[string]Depth{"stuck": {Pending: 500}} }
	r := startWith(t, Config{Client: cli, Namespace: ns, Manual: true, Depth: depth})
	if ok, err := r.CloseMinute(context.Background(), t0); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	// What 25 hours do: the lease ends and the record goes.
	if _, err := cli.Revoke(context.Background(), lease); err != nil {
		t.Fatal(err)
	}
	m := t0.Add(25 * time.Hour)
	if ok, err := r.CloseMinute(context.Background(), m); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	h, err := Read(context.Background(), cli, ns, "stuck", Hour, m)
	if err != nil {
		t.Fatal(err)
	}
	if got := minuteOf(h, m).Pending; got != 500 {
		t.Errorf("500 tasks pending all along; the history's last minute says %d", got)
	}
}

// A server that closes a minute before it knows the depths (Depth returns
// nil: it just started) writes "depth unknown", and a reader carries the
// depth before, not 0.
func TestDepthUnknownAfterRestartKeepsTheLast(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	r := startWith(t, Config{Client: cli, Namespace: ns, Manual: true,
		Depth: func() map[string]Depth { return map[string]Depth{"busy": {Pending: 40}} }})
	if ok, err := r.CloseMinute(context.Background(), t0); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	// The next minute closes with another queue only: busy's depth did not change.
	if _, err := cli.Put(context.Background(), keys.QueueDoneKey("other", "SUCCEEDED", time.Now(), "x"), ""); err != nil {
		t.Fatal(err)
	}
	waitCounted(t, r, "other", Counts{Processed: 1})
	if ok, err := r.CloseMinute(context.Background(), t0.Add(time.Minute)); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	_ = r.Stop(context.Background())
	r2 := startWith(t, Config{Client: cli, Namespace: ns, Manual: true,
		Now: func() time.Time { return t0.Add(3 * time.Minute) }, Depth: func() map[string]Depth { return nil }})
	if _, err := cli.Put(context.Background(), keys.QueueDoneKey("busy", "SUCCEEDED", time.Now(), "x"), ""); err != nil {
		t.Fatal(err)
	}
	waitCounted(t, r2, "busy", Counts{Processed: 1})
	m1 := t0.Add(2 * time.Minute)
	if ok, err := r2.CloseMinute(context.Background(), m1); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	h, _ := Read(context.Background(), cli, ns, "busy", Hour, m1)
	if got := minuteOf(h, m1).Pending; got != 40 {
		t.Errorf("depth unknown after restart: want the last (40) kept, record says %d", got)
	}
}

// A queue that goes (deleted, or emptied) gets a record with depth 0 and
// is then forgotten: the recorder's memory does not grow with the queues
// that ever were.
func TestDepthOfAQueueGoneIsForgotten(t *testing.T) {
	ns := etcdtest.Namespace(t)
	var mu sync.Mutex
	depths := map[string]Depth{"gone": {Pending: 3}}
	depth := func() map[string]Depth {
		mu.Lock()
		defer mu.Unlock()
		return depths
	}
	r := startWith(t, Config{Client: srv.Client(t), Namespace: ns, Manual: true, Depth: depth})
	if ok, err := r.CloseMinute(context.Background(), t0); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	mu.Lock()
	depths = map[string]Depth{}
	mu.Unlock()
	m1 := t0.Add(time.Minute)
	if ok, err := r.CloseMinute(context.Background(), m1); !ok || err != nil {
		t.Fatalf("close: %v %v", ok, err)
	}
	h, err := Read(context.Background(), srv.Client(t), ns, "gone", Hour, m1)
	if err != nil || minuteOf(h, t0).Pending != 3 || minuteOf(h, m1).Pending != 0 {
		t.Fatalf("depths %+v then %+v (%v)", minuteOf(h, t0).Depth, minuteOf(h, m1).Depth, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.written) != 0 {
		t.Errorf("remembered %v", r.written)
	}
}

// A window whose record before says "depth unknown" starts with the
// depth of the last record before it that knew.
func TestDepthBeforeTheWindowSkipsUnknown(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	end := t0.Add(2 * time.Hour)
	start := end.Add(time.Minute - Hour)
	for at, rec := range map[time.Time]record{
		start.Add(-3 * time.Minute): {Depth: Depth{Pending: 40}},
		start.Add(-time.Minute):     {Counts: Counts{Processed: 2}, Unknown: true},
	} {
		if _, err := cli.Put(context.Background(), keys.QueueHistoryMinute("q", at), string(rec.encode())); err != nil {
			t.Fatal(err)
		}
	}
	h, err := Read(context.Background(), cli, ns, "q", Hour, end)
	if err != nil {
		t.Fatal(err)
	}
	if !h.Minutes[0].At.Equal(start) || h.Minutes[0].Pending != 40 || minuteOf(h, end).Pending != 40 {
		t.Errorf("window from %v starts with depth %+v, ends with %+v; want 40 pending", h.Minutes[0].At, h.Minutes[0].Depth, minuteOf(h, end).Depth)
	}
}
