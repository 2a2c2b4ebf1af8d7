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
		from := max(t.rev+1, compacted)
		if compacted, err = c.waitRecord(ctx, id, from); err != nil {
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
	wch := c.cli.Watch(clientv3.WithRequireLeader(wctx), c.keys.TaskRecord(id), clientv3.WithRev(from))
	for {
		select {
		case wr, ok := <-wch:
			switch {
			case !ok:
				return 0, ctx.Err()
			case wr.CompactRevision > 0:
				return wr.CompactRevision, nil
			case wr.Err() != nil || len(wr.Events) > 0:
				return 0, ctx.Err()
			}
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}
