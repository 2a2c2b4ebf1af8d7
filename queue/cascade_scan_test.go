package queue_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// A cascade left by the process that began it (a parent cancelled alone)
// is finished by the scans of the servers (ScanCascades, of every queue),
// without any worker of the parent's queue running; of two scanners that
// read the mark, one claims it and runs the cascade, once.
func TestCascadeScannedByTwoServers(t *testing.T) {
	t.Cleanup(queue.SetCascadeRescan(100 * time.Millisecond)) // first: restored after the scans stop
	var mu sync.Mutex
	runs := map[string]int{}
	queue.SetCascadeRunHook(func(parent string) { mu.Lock(); runs[parent]++; mu.Unlock() })
	t.Cleanup(func() { queue.SetCascadeRunHook(nil) })
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupIdle(t, c, "p")
	f := newFamily(0)
	f.children = idleChildren
	stop := runParents(t, cli, ns, f)
	wantStatus(t, c, queue.Waiting, "p")
	stop() // no worker of the parent's queue runs from here on

	ctx := context.Background()
	if _, err := queue.CancelAlone(ctx, c, "p"); err != nil {
		t.Fatal(err)
	}
	if n := markCount(t, cli, ns); n != 1 {
		t.Fatalf("%d cascade marks after the cancel alone; want 1", n)
	}
	sctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	var scanners atomic.Int32
	for range 2 {
		s, err := queue.NewClient(cli, ns)
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() { defer wg.Done(); scanners.Add(1); s.ScanCascades(sctx, slog.Default()) }()
	}
	wantStatus(t, c, queue.Cancelled, "p.1.0", "p.1.1")
	waitUntil(t, "the cascade mark to go", func() bool { return markCount(t, cli, ns) == 0 })
	time.Sleep(500 * time.Millisecond) // a few more rescans at 100 ms: none runs it again
	cancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if scanners.Load() != 2 || runs["p"] != 1 {
		t.Fatalf("the cascade of p ran %d times under %d scanners; want once", runs["p"], scanners.Load())
	}
}
