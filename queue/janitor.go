package queue

import (
	"context"
	"encoding/json"
	"math/rand/v2"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// promoteRetries moves retry keys whose time has come back to pending. It
// sleeps until the earliest one is due and wakes early when a retry is
// scheduled, so no task is polled. Several workers may race for one retry;
// each move is a transaction that only one wins.
func (w *Worker) promoteRetries(ctx context.Context) {
	pre := w.keys.QueueRetry(w.cfg.Queue)
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		wch := w.cli.Watch(clientv3.WithRequireLeader(wctx), pre, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
		if err := watchOpened(wctx, wch); err != nil {
			cancel()
			sleepCtx(ctx, time.Second)
			continue
		}
		for ctx.Err() == nil {
			due, err := w.sched.promoteDue(wctx, pre)
			if err != nil {
				break
			}
			var timer *time.Timer
			var fire <-chan time.Time
			if !due.IsZero() {
				timer = time.NewTimer(time.Until(due))
				fire = timer.C
			}
			reopenNow := false
			select {
			case <-fire:
			case wr, ok := <-wch:
				reopenNow = !ok || wr.Err() != nil
			case <-ctx.Done():
			}
			if timer != nil {
				timer.Stop()
			}
			if reopenNow {
				goto reopen
			}
		}
	reopen:
		cancel()
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// promoteDue moves every due retry back to pending and returns when the next
// one is due (zero when none is scheduled).
func (w *claimer) promoteDue(ctx context.Context, pre string) (time.Time, error) {
	for {
		now := time.Now()
		g, err := w.cli.Get(ctx, pre, clientv3.WithRange(keyspace.TimeBound(pre, now.UnixNano()+1)), clientv3.WithLimit(50))
		if err != nil {
			return time.Time{}, err
		}
		if len(g.Kvs) > 0 {
			ops := make([]clientv3.Op, 0, len(g.Kvs))
			var markers []clientv3.Op
			levels := map[string]bool{}
			for _, kv := range g.Kvs {
				var rv retryValue
				if json.Unmarshal(kv.Value, &rv) != nil || rv.PendingKey == "" {
					w.logger.Error("queue: dropping an unreadable retry key", "key", string(kv.Key))
					ops = append(ops, clientv3.OpDelete(string(kv.Key)))
					continue
				}
				ops = append(ops, clientv3.OpTxn(
					[]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)},
					[]clientv3.Op{clientv3.OpDelete(string(kv.Key)), clientv3.OpPut(rv.PendingKey, encodePending(rv.Attempts, false))}, nil))
				if lv := w.client.levelOfPending(w.queue, rv.PendingKey); lv != "" && !levels[lv] {
					levels[lv] = true
					markers = append(markers, clientv3.OpPut(w.client.levelKey(w.queue, lv), ""))
				}
			}
			ops = append(ops, markers...)
			if _, err := w.cli.Txn(ctx).Then(ops...).Commit(); err != nil {
				return time.Time{}, err
			}
			if g.More {
				continue
			}
		}
		next, err := w.cli.Get(ctx, pre, clientv3.WithPrefix(), clientv3.WithLimit(1), clientv3.WithKeysOnly())
		if err != nil || len(next.Kvs) == 0 {
			return time.Time{}, err
		}
		ns, _, _ := keyspace.ParseTimedKey(pre, string(next.Kvs[0].Key))
		return time.Unix(0, ns), nil
	}
}

// watchCancels cancels the context of a running task when someone asks to
// cancel it. The first watch resumes after from (0: from when it is set
// up).
func (w *Worker) watchCancels(ctx context.Context, from int64) {
	pre := w.keys.QueueCancel(w.cfg.Queue)
	last := from // the last revision seen: a reopened watch resumes after it
	if hook := testHookWatchOpen.Load(); hook != nil {
		(*hook)()
	}
	for ctx.Err() == nil {
		opts := []clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithFilterDelete()}
		if last > 0 {
			opts = append(opts, clientv3.WithRev(last+1))
		}
		wch := w.cli.Watch(clientv3.WithRequireLeader(ctx), pre, opts...)
		for wr := range wch {
			if wr.CompactRevision > 0 {
				last = 0 // fell behind compaction: start from now
			} else if wr.Header.Revision > last {
				last = wr.Header.Revision
			}
			for _, ev := range wr.Events {
				id, _ := keyspace.Last(pre, string(ev.Kv.Key))
				w.mu.Lock()
				if r := w.inflight[id]; r != nil {
					r.cancel(ErrCancelled)
				}
				w.mu.Unlock()
			}
		}
		sleepCtx(ctx, 100*time.Millisecond)
	}
}

// afterLostRace waits a random moment of up to 20 ms (or until ctx ends)
// before a claim that lost its tasks to others tries again, so that the
// claims that lost do not meet again at once.
func afterLostRace(ctx context.Context) {
	sleepCtx(ctx, raceGap())
}

// raceGap is how long a claim that lost a race waits before it tries
// again: a random moment of 1 to 20 ms (never 0, which waitForWork takes
// for "no bound").
func raceGap() time.Duration {
	return time.Millisecond + time.Duration(rand.Int64N(int64(19*time.Millisecond)))
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// removeExpired removes finished tasks past their retention, every
// retention/24 (between a minute and an hour), until ctx ends.
func (w *Worker) removeExpired(ctx context.Context) {
	if w.cfg.Retention < 0 {
		return
	}
	every := min(max(w.cfg.Retention/24, time.Minute), time.Hour)
	for {
		if n, err := w.client.RemoveExpired(ctx, w.cfg.Queue, w.cfg.Retention); err != nil && ctx.Err() == nil {
			w.logger.Warn("queue: removing expired tasks failed; trying again later", "queue", w.cfg.Queue, "err", err)
		} else if n > 0 {
			w.logger.Info("queue: removed expired tasks", "queue", w.cfg.Queue, "tasks", n)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

// countDepth sets the drover_queue_tasks gauges every DepthInterval.
func (w *Worker) countDepth(ctx context.Context) {
	if w.cfg.DepthInterval <= 0 {
		return
	}
	t := time.NewTicker(w.cfg.DepthInterval)
	defer t.Stop()
	for {
		if st, err := w.client.Stats(ctx, w.cfg.Queue); err == nil {
			q := w.cfg.Queue
			for state, n := range map[string]int64{"pending": st.Pending, "running": st.Running, "retrying": st.Retrying,
				"succeeded": st.Succeeded, "dead": st.Dead, "cancelled": st.Cancelled} {
				metrics.QueueTasks.WithLabelValues(q, state).Set(float64(n))
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
