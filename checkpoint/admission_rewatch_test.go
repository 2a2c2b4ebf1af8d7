package checkpoint_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// breakingWatcher is etcd's own watcher with faults on demand for the
// watches of one key: Break ends every open watch as a cancelled watch would
// end, and Hold keeps the next watches from opening until Open.
type breakingWatcher struct {
	clientv3.Watcher
	key string

	mu     sync.Mutex
	broken chan struct{} // closed by Break: ends the watches open now
	gate   chan struct{} // nil, or closed by Open: new watches wait for it
	opened int           // watches opened
}

func newBreakingWatcher(w clientv3.Watcher, key string) *breakingWatcher {
	return &breakingWatcher{Watcher: w, key: key, broken: make(chan struct{})}
}

func (w *breakingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	if key != w.key { // the lock's own watches
		return w.Watcher.Watch(ctx, key, opts...)
	}
	w.mu.Lock()
	gate := w.gate
	w.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
		}
	}
	w.mu.Lock()
	w.opened++
	broken := w.broken
	w.mu.Unlock()
	wctx, cancel := context.WithCancel(ctx)
	in := w.Watcher.Watch(wctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		defer cancel()
		for {
			select {
			case wr, ok := <-in:
				if !ok {
					return
				}
				select {
				case out <- wr:
				case <-ctx.Done():
					return
				}
			case <-broken:
				// As a watch the server cancelled: one response, then
				// the channel closes.
				select {
				case out <- clientv3.WatchResponse{Canceled: true}:
				case <-ctx.Done():
				}
				return
			}
		}
	}()
	return out
}

// Break ends every watch open now.
func (w *breakingWatcher) Break() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.broken)
	w.broken = make(chan struct{})
}

// Hold makes the watches opened from now on wait until Open.
func (w *breakingWatcher) Hold() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gate = make(chan struct{})
}

// Open lets held watches open.
func (w *breakingWatcher) Open() {
	w.mu.Lock()
	defer w.mu.Unlock()
	close(w.gate)
	w.gate = nil
}

func (w *breakingWatcher) Opened() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.opened
}

// compactNow compacts etcd up to its current revision.
func compactNow(t *testing.T, cli *clientv3.Client, ns string) {
	t.Helper()
	ctx := context.Background()
	put, err := cli.Put(ctx, ns+"/compact-marker", "x")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Compact(ctx, put.Header.Revision, clientv3.WithCompactPhysical()); err != nil {
		t.Fatal(err)
	}
}

// TestAdmissionInterruptAfterWatchBreaks: the watch on a run's interrupt key
// breaks (as on a lost leader or a cancelled watch) and etcd compacts past
// its revision; an Interrupt written after the break, or while no watch was
// open, still interrupts the run.
func TestAdmissionInterruptAfterWatchBreaks(t *testing.T) {
	t.Parallel()
	own, cli := etcdtest.StartOwn(t) // compactions stay in this test's etcd
	for _, tc := range []struct {
		name string
		// gap: the interrupt is written while no watch is open, and
		// compacted away before the watch opens again.
		gap bool
	}{{name: "interrupt after the watch resumed"}, {name: "interrupt while no watch is open", gap: true}} {
		t.Run(tc.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			runCli := own.Client(t)
			keys, err := keyspace.New(ns)
			if err != nil {
				t.Fatal(err)
			}
			bw := newBreakingWatcher(runCli.Watcher, keys.CheckpointInterrupt("th"))
			runCli.Watcher = bw
			admitter := func(c *clientv3.Client) *checkpoint.Admitter {
				locker, err := lock.NewEtcd(ctx, c, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = locker.Close(context.Background()) })
				a, err := checkpoint.NewAdmitter(c, ns, locker)
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			running, newer := admitter(runCli), admitter(cli)
			run, err := running.Admit(ctx, "th", checkpoint.Enqueue)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				<-run.Context().Done()
				_ = run.Release(context.Background())
			}()
			if !etcdtest.Eventually(30*time.Second, func() bool { return bw.Opened() == 1 }) {
				t.Fatalf("the run's watch did not open: %d opened", bw.Opened())
			}
			if tc.gap {
				bw.Hold()
			}
			bw.Break()
			admitted := make(chan error, 1)
			var next *checkpoint.Run
			go func() {
				actx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				var err error
				next, err = newer.Admit(actx, "th", checkpoint.Interrupt)
				admitted <- err
			}()
			if tc.gap {
				// Wait for the interrupt to be written, then compact it
				// away before the run's watch opens again.
				if !etcdtest.Eventually(30*time.Second, func() bool {
					g, err := cli.Get(ctx, keys.CheckpointInterrupt("th"), clientv3.WithCountOnly())
					return err == nil && g.Count == 1
				}) {
					t.Fatal("the interrupt was not written")
				}
				compactNow(t, cli, ns)
				bw.Open()
			} else {
				compactNow(t, cli, ns)
			}
			if err := <-admitted; err != nil {
				t.Fatalf("the interrupting run was not admitted: %v (watches opened: %d)", err, bw.Opened())
			}
			if !errors.Is(context.Cause(run.Context()), checkpoint.ErrInterrupted) {
				t.Fatalf("the first run's cause: %v, want ErrInterrupted", context.Cause(run.Context()))
			}
			if bw.Opened() < 2 {
				t.Fatalf("watches opened: %d, want the broken one opened again", bw.Opened())
			}
			if err := next.Release(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
