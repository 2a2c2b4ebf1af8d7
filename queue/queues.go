package queue

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrNoQueue: no task was ever submitted to the queue and it has no
// settings; the name is probably misspelt.
var ErrNoQueue = errors.New("queue: no such queue")

// ErrQueueBusy: the queue has running tasks, so it cannot be deleted.
var ErrQueueBusy = errors.New("queue: has running tasks")

// QueueInfo is a queue of the directory with its counts.
type QueueInfo struct {
	Name  string `json:"name"`
	Stats Stats  `json:"stats"`
	// Config is the queue's settings.
	Config Config `json:"config"`
}

// Queues lists every queue that was submitted to or configured, by name,
// with its counts and settings.
func (c *Client) Queues(ctx context.Context) ([]QueueInfo, error) {
	pre := c.keys.QueueNames()
	out := []QueueInfo{}
	from := pre
	for {
		g, err := c.cli.Get(ctx, from, clientv3.WithRange(clientv3.GetPrefixRangeEnd(pre)), clientv3.WithKeysOnly(), clientv3.WithLimit(500))
		if err != nil {
			return nil, fmt.Errorf("queue: list queues: %w", err)
		}
		for _, kv := range g.Kvs {
			q, _ := keyspace.Last(pre, string(kv.Key))
			st, err := c.Stats(ctx, q)
			if err != nil {
				return nil, err
			}
			cfg, err := c.GetConfig(ctx, q)
			if err != nil {
				return nil, err
			}
			out = append(out, QueueInfo{Name: q, Stats: st, Config: cfg})
		}
		if !g.More || len(g.Kvs) == 0 {
			return out, nil
		}
		from = string(g.Kvs[len(g.Kvs)-1].Key) + "\x00"
	}
}

// Exists reports whether queue q is in the directory (it was submitted to
// or configured) or holds any key.
func (c *Client) Exists(ctx context.Context, q string) (bool, error) {
	if err := CheckQueue(q); err != nil {
		return false, err
	}
	resp, err := c.cli.Txn(ctx).Then(
		clientv3.OpGet(c.keys.QueueName(q), clientv3.WithCountOnly()),
		clientv3.OpGet(c.keys.Queue(q), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithLimit(1)),
	).Commit()
	if err != nil {
		return false, fmt.Errorf("queue: look up queue %s: %w", q, err)
	}
	return resp.Responses[0].GetResponseRange().Count > 0 || len(resp.Responses[1].GetResponseRange().Kvs) > 0, nil
}

// noQueue returns an error matching ErrNoQueue for queue q.
func noQueue(q string) error {
	return fmt.Errorf("%w %s: nothing was ever submitted to it; check the name (drover queues list)", ErrNoQueue, q)
}

// nameOp registers queue q in the directory.
func (c *Client) nameOp(q string) clientv3.Op {
	return clientv3.OpPut(c.keys.QueueName(q), time.Now().UTC().Format(time.RFC3339))
}

// DeleteQueue deletes queue q and every task in it (pending, waiting to
// retry, dead or finished: records, checkpoints and index keys), then its
// settings and its entry in the directory. It refuses while tasks are
// running: stop the queue's workers (or cancel those tasks) first. Stop
// submitting to the queue first too: a task submitted during the deletion
// may survive it. progress, if set, is called with the number of tasks
// deleted so far.
func (c *Client) DeleteQueue(ctx context.Context, q string, progress func(done int)) (int, error) {
	ok, err := c.Exists(ctx, q)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, noQueue(q)
	}
	st, err := c.Stats(ctx, q)
	if err != nil {
		return 0, err
	}
	if st.Running > 0 {
		return 0, fmt.Errorf("%w: queue %s has %d running tasks; stop its workers or cancel those tasks (drover tasks list --queue %s --status RUNNING), then delete it", ErrQueueBusy, q, st.Running, q)
	}
	n := 0
	// Those that wait on a due index before those pending: a sleep or a
	// retry that falls due while this runs goes to pending, and is
	// purged there, rather than from the index already purged.
	for _, s := range []Status{Scheduled, Sleeping, Waiting, Retrying, Pending, Dead, Succeeded, Cancelled} {
		base := n
		k, err := c.Purge(ctx, q, s, nil, func(done int) {
			if progress != nil {
				progress(base + done)
			}
		})
		n += k
		if err != nil {
			return n, err
		}
	}
	// What is left: settings, level markers, counts, cancel signals, and
	// index keys of tasks whose record was gone.
	if _, err := c.cli.Txn(ctx).Then(clientv3.OpDelete(c.keys.Queue(q), clientv3.WithPrefix()), clientv3.OpDelete(c.keys.QueueName(q)),
		clientv3.OpDelete(c.keys.Segments(q), clientv3.WithPrefix())).Commit(); err != nil {
		return n, fmt.Errorf("queue: delete queue %s: %w", q, err)
	}
	return n, nil
}
