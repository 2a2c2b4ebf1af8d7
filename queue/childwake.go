package queue

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// A child's terminal outcome puts its parent's wake mark,
// child-wakes/{q}/{parent}, in the same request (children.go). Every
// worker of queue q handles the marks of its queue's parents: it reads
// them, then watches them; for each it counts the parent's children and,
// when the parent's wait is over, wakes it (a fenced move back to pending,
// Client.wake); then it deletes the mark, only if no child put it again
// since. A mark whose handling failed stays, and is handled again at the
// next rescan. A mark is per parent, not per child: 10,000 children that
// end in a few hundred requests cost their parent a few hundred counts at
// most, fewer when they end faster than it is counted, since one count
// handles every put the watch delivered together.

// childRescan is how often a waker reads its marks again, for those whose
// handling failed.
const childRescan = 30 * time.Second

// childWakeWidth bounds the parents a waker handles at once.
const childWakeWidth = 8

// childWakerOf handles the wake marks of queue q's parents.
type childWakerOf struct {
	c      *Client
	q      string
	pre    string
	logger *slog.Logger
	logged atomic.Int64 // when a failure was last logged, Unix ns
}

// warn logs a failure, at most once a minute: an outage retried every
// few hundred milliseconds would otherwise fill the log.
func (k *childWakerOf) warn(msg string, args ...any) {
	now, last := time.Now().UnixNano(), k.logged.Load()
	if now-last > int64(time.Minute) && k.logged.CompareAndSwap(last, now) {
		k.logger.Warn(msg, args...)
	}
}

func (c *Client) childWaker(q string, logger *slog.Logger) *childWakerOf {
	return &childWakerOf{c: c, q: q, pre: c.keys.ChildWakes(q), logger: logger}
}

// run handles marks until ctx ends; after an error it waits a moment and
// starts again (a new read, a new watch), so an outage delays wakes but
// loses none.
func (k *childWakerOf) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := k.runOnce(ctx)
		if err == nil || ctx.Err() != nil {
			continue
		}
		k.warn("queue: waking parents of finished children failed; retrying", "queue", k.q, "err", err)
		_ = lifecycle.Sleep(ctx, time.Duration(100+rand.IntN(100))*time.Millisecond)
	}
}

// runOnce reads the marks and handles them, then handles those the watch
// delivers, until the watch fails or ctx ends.
func (k *childWakerOf) runOnce(ctx context.Context) error {
	g, err := k.c.cli.Get(ctx, k.pre, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read the wake marks of %s: %w", k.q, err)
	}
	k.handle(ctx, g.Kvs)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := k.c.cli.Watch(clientv3.WithRequireLeader(wctx), k.pre, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(g.Header.Revision+1))
	rescan := time.NewTimer(childRescan)
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rescan.C:
			return nil // read them again
		case wr, ok := <-wch:
			if !ok {
				return fmt.Errorf("the watch of the wake marks of %s ended", k.q)
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watch the wake marks of %s: %w", k.q, err)
			}
			latest := map[string]*mvccpb.KeyValue{}
			for _, ev := range wr.Events {
				latest[string(ev.Kv.Key)] = ev.Kv
			}
			kvs := make([]*mvccpb.KeyValue, 0, len(latest))
			for _, kv := range latest {
				kvs = append(kvs, kv)
			}
			k.handle(ctx, kvs)
		}
	}
}

// handle handles marks kvs: each parent's wait is checked and, when over,
// the parent woken; the mark is then deleted unless put again since.
func (k *childWakerOf) handle(ctx context.Context, kvs []*mvccpb.KeyValue) {
	var g errgroup.Group
	g.SetLimit(childWakeWidth)
	for _, kv := range kvs {
		g.Go(func() error {
			parent := keyspace.Rest(k.pre, string(kv.Key))
			if _, err := k.c.wakeParent(ctx, parent); err != nil {
				if ctx.Err() == nil {
					k.warn("queue: could not wake a parent task; trying again later", "task", parent, "err", err)
				}
				return nil // the mark stays: the next rescan tries again
			}
			key := string(kv.Key)
			_, _ = k.c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).Then(clientv3.OpDelete(key)).Commit()
			return nil
		})
	}
	_ = g.Wait()
}
