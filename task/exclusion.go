package task

import (
	"context"

	"github.com/droverhq/drover/internal/taskstore"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitQueueClaim returns once no queue worker holds a claim on task id: a
// task id is run by one claimer at a time, a runner or a queue worker
// (taskstore's rule). The caller holds the task's lock, whose key keeps
// queue workers from claiming the task from now on (their claim requires
// the lock to have no holder and no waiter), so only a claim made before
// can exist; it ends when its task attempt does, or when its worker's
// lease does. waiting is told the queue when there is one to wait for. It
// returns early with the cause when held (the lock's context) ends, or
// with ctx's error.
func (s *Store) waitQueueClaim(ctx context.Context, id string, held context.Context, waiting func(queue string)) error {
	hold, ok, err := taskstore.FindQueueHold(ctx, s.cli, s.keys, id)
	if err != nil || !ok {
		return err // nil when not a queued task
	}
	told := false
	for {
		holder, rev, err := hold.Holder(ctx, s.cli)
		if err != nil {
			return err
		}
		if holder == "" {
			return nil
		}
		if !told {
			waiting(hold.Queue)
			told = true
		}
		if err := waitGone(ctx, held, s.cli, holder, rev); err != nil {
			return err
		}
	}
}

// waitGone returns once key is deleted after revision rev (or the watch
// broke: the caller reads again), or with the cause when ctx or held ends.
func waitGone(ctx, held context.Context, cli *clientv3.Client, key string, rev int64) error {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(held, cancel)
	defer stop()
	wch := cli.Watch(clientv3.WithRequireLeader(wctx), key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	for {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil || len(wr.Events) > 0 {
				if held.Err() != nil {
					return context.Cause(held)
				}
				return ctx.Err()
			}
		case <-wctx.Done():
			if held.Err() != nil {
				return context.Cause(held)
			}
			return ctx.Err()
		}
	}
}
