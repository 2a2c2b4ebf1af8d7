package queue

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Terminal reports whether st is a final status: SUCCEEDED, DEAD or
// CANCELLED.
func (st Status) Terminal() bool { return st == Succeeded || st == Dead || st == Cancelled }

// Wait blocks until task id is SUCCEEDED, DEAD or CANCELLED and returns it,
// or until ctx ends. It watches the task's record, which every terminal
// outcome rewrites, so it does not poll.
func (c *Client) Wait(ctx context.Context, id string) (*Task, error) {
	var compacted int64 // the watch may not start before this revision
	for {
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if t.CurrentStatus.Terminal() {
			return t, nil
		}
		if t.seg != nil {
			from := max(t.seg.rev+1, compacted)
			compacted, err = c.waitSegment(ctx, id, t.seg, from)
		} else {
			from := max(t.rev+1, compacted)
			compacted, err = c.waitRecord(ctx, id, from)
		}
		if err != nil {
			return t, fmt.Errorf("queue: wait for task %s (last %s): %w", id, t.CurrentStatus, err)
		}
	}
}

// waitRecord returns once task id's record changed at or after revision
// from, or the watch broke (the caller reads again), or with ctx's error. A
// watch refused because from was compacted away returns the compaction
// revision, from which the next watch starts (the caller's read covers what
// came before).
func (c *Client) waitRecord(ctx context.Context, id string, from int64) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	return waitChange(ctx, c.cli.Watch(clientv3.WithRequireLeader(wctx), c.keys.TaskRecord(id), clientv3.WithRev(from)))
}

// waitSegment is waitRecord for a task in a segment: it ends when an
// outcome or an exit is written in the task's segment (the task's own or
// another's: the caller reads again), or the task's index key changes (a
// purge removed it).
func (c *Client) waitSegment(ctx context.Context, id string, at *segRef, from int64) (int64, error) {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := func(key string, opts ...clientv3.OpOption) clientv3.WatchChan {
		return c.cli.Watch(clientv3.WithRequireLeader(wctx), key, append(opts, clientv3.WithRev(from))...)
	}
	return waitChange(ctx, watch(c.keys.Outs(at.queue, at.seg), clientv3.WithPrefix()),
		watch(c.keys.Exits(at.queue, at.seg), clientv3.WithPrefix()), watch(c.keys.TaskIndex(id)))
}

// waitChange returns once one of the watches reports a change or breaks;
// see waitRecord.
func waitChange(ctx context.Context, watches ...clientv3.WatchChan) (int64, error) {
	merged := make(chan clientv3.WatchResponse, len(watches))
	fctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, wch := range watches {
		go func() {
			for {
				var wr clientv3.WatchResponse
				select {
				case r, ok := <-wch:
					if ok && r.Err() == nil && r.CompactRevision == 0 && len(r.Events) == 0 {
						continue // nothing happened yet
					}
					wr = r
				case <-fctx.Done():
					return
				}
				select {
				case merged <- wr:
				case <-fctx.Done():
				}
				return
			}
		}()
	}
	select {
	case wr := <-merged:
		if wr.CompactRevision > 0 {
			return wr.CompactRevision, nil
		}
		return 0, ctx.Err()
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}
