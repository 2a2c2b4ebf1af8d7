package due

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// errorLogEvery is how often Run logs its errors at most.
const errorLogEvery = time.Minute

// Run moves items as they fall due until ctx ends: one watch of the
// prefix (puts only) and one timer. After an error it waits a moment and
// starts again (a new watch, a new read), so an outage delays items but
// loses none; the wait doubles with each failure in a row, from 100-200
// ms to 3.2-6.4 s (retryDelay). A try that moved items before it failed
// made progress: the count starts again, so one batch that keeps failing
// among others that move does not slow the mover down.
//
// Each error is counted in drover_due_errors_total{index} and logged, at
// most once a minute: an outage retried every 100-200 ms would otherwise
// fill the log.
func (ix *Index) Run(ctx context.Context) {
	fails := 0 // failures in a row
	for ctx.Err() == nil {
		moved, progressed, err := ix.runOnce(ctx)
		if progressed || moved > 0 {
			fails = 0
		}
		if err != nil && ctx.Err() == nil {
			ix.failed(err)
			fails++
		}
		d := retryDelay(fails, func(d time.Duration) time.Duration { return time.Duration(rand.Int64N(int64(d))) })
		if ix.pause != nil {
			ix.pause(ctx, d)
			continue
		}
		sleep(ctx, d)
	}
}

// failed counts and, unless it logged less than errorLogEvery ago, logs
// err, an error of Run.
func (ix *Index) failed(err error) {
	name := cmp.Or(ix.Name, "due")
	metrics.DueErrors.WithLabelValues(name).Inc()
	if ix.unlogged++; !ix.logged.IsZero() && time.Since(ix.logged) < errorLogEvery {
		return
	}
	logger := cmp.Or(ix.Logger, slog.Default())
	logger.Warn("due: moving due items failed; trying again", "index", name, "prefix", ix.Prefix, "errors", ix.unlogged, "err", err)
	ix.logged, ix.unlogged = time.Now(), 0
}

// runOnce runs one watch until it fails (its error) or ctx ends (nil);
// progressed says a read and its moves succeeded meanwhile, moved is how
// many items it moved (some, perhaps, by a read that then failed). It reads the items
// from the time up to which it moved them all on (from), lowered when the
// watch shows an item put that is due before it.
func (ix *Index) runOnce(ctx context.Context) (moved int, progressed bool, err error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := ix.Client.Watch(clientv3.WithRequireLeader(wctx), ix.Prefix, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithCreatedNotify())
	select {
	case wr, ok := <-wch:
		if err := watchErr(wr, ok); err != nil {
			return 0, false, err
		}
	case <-ctx.Done():
		return 0, false, nil
	}
	var from time.Time // zero: from the first item (the watch came after)
	for ctx.Err() == nil {
		next, done, n, err := ix.promote(wctx, from)
		if moved += n; err != nil {
			return moved, progressed, err
		}
		from, progressed = done, true
		var fire <-chan time.Time
		var timer *time.Timer
		if !next.IsZero() {
			timer = time.NewTimer(next.Sub(ix.now()))
			fire = timer.C
		}
	wait:
		select {
		case <-fire:
		case wr, ok := <-wch:
			if err := watchErr(wr, ok); err != nil {
				if timer != nil {
					timer.Stop()
				}
				return moved, progressed, err
			}
			if len(wr.Events) == 0 {
				goto wait
			}
			first, ok := earliest(ix.Prefix, wr.Events)
			if !ok || first.Before(from) {
				from = first // zero for a key that is not an item's: read all
			}
			if ok && !next.IsZero() && !first.Before(next) {
				goto wait // an item due after the next: the timer stands
			}
		case <-ctx.Done():
		}
		if timer != nil {
			timer.Stop()
		}
	}
	return moved, progressed, nil
}

// watchErr is the error of a watch's response wr (ok false: the channel
// closed).
func watchErr(wr clientv3.WatchResponse, ok bool) error {
	if !ok {
		return errors.New("due: the watch ended")
	}
	if err := wr.Err(); err != nil {
		return fmt.Errorf("due: watch: %w", err)
	}
	return nil
}

// earliest returns the earliest due time of the items events put; false
// when one of them is not an item's key.
func earliest(prefix string, events []*clientv3.Event) (time.Time, bool) {
	var first time.Time
	for _, ev := range events {
		at, _, ok := Parse(prefix, string(ev.Kv.Key))
		if !ok {
			return time.Time{}, false
		}
		if first.IsZero() || at.Before(first) {
			first = at
		}
	}
	return first, true
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Retries of a Run whose reads or moves fail: the pause after the k-th
// failure in a row is retryBase doubled k-1 times, at most retryMax, and a
// random part up to as much again, so that a mover whose moves keep
// failing (its turns ending each time) leaves the backlog to the others
// and an outage is not retried ten times a second by every mover.
const (
	retryBase = 100 * time.Millisecond
	retryMax  = 3200 * time.Millisecond
)

// retryDelay is the pause after fails failures in a row (at least one:
// runOnce returns without an error only when ctx ended), with jitter(d)
// in [0, d) added: retryBase to twice it after the first.
func retryDelay(fails int, jitter func(d time.Duration) time.Duration) time.Duration {
	d := retryBase
	for range min(fails-1, 16) {
		if d *= 2; d >= retryMax {
			d = retryMax
			break
		}
	}
	return d + jitter(d)
}
