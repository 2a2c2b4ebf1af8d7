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
	for {
		t, err := c.Get(ctx, id)
		if err != nil {
			return nil, err
		}
		if t.CurrentStatus.Terminal() {
			return t, nil
		}
		if err := c.waitRecord(ctx, id, t.rev); err != nil {
			return t, fmt.Errorf("queue: wait for task %s (last %s): %w", id, t.CurrentStatus, err)
		}
	}
}

// waitRecord returns once task id's record changed after revision rev (or
// the watch broke, so the caller reads again), or with ctx's error.
func (c *Client) waitRecord(ctx context.Context, id string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := c.cli.Watch(clientv3.WithRequireLeader(wctx), c.keys.TaskRecord(id), clientv3.WithRev(rev+1))
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || len(wr.Events) > 0 {
				return ctx.Err()
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
