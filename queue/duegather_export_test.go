package queue

import (
	"context"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ReadDueKeys reads queue q's due index: its keys and values, in due
// order, as the scheduled index's batch read sees them.
func ReadDueKeys(ctx context.Context, c *Client, q string) ([]*mvccpb.KeyValue, error) {
	g, err := c.cli.Get(ctx, c.keys.QueueDue(q), clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	return g.Kvs, nil
}

// MoveDueKeys moves the due segments kvs of queue q, as read, in one
// request of the scheduled index (a mover whose read is stale, or a retry
// of a request whose reply was lost), and returns how many it moved.
func MoveDueKeys(ctx context.Context, c *Client, q string, kvs []*mvccpb.KeyValue) (int, error) {
	return c.scheduledIndex(q).MoveItems(ctx, kvs)
}

// SetGatherReadHook makes f run after a gathered move's read and before
// its write (nil: nothing); the caller resets it before its test ends.
func SetGatherReadHook(f func()) { testHookGatherRead = f }

// SetGatherExitsRead sets how many exits a gathered move reads per level
// and returns a func that restores it.
func SetGatherExitsRead(n int64) func() {
	old := gatherExitsRead
	gatherExitsRead = n
	return func() { gatherExitsRead = old }
}

// SetGatheredSuffix makes gathered segments' names end in suffix and
// returns a func that restores the random one.
func SetGatheredSuffix(suffix string) func() {
	old := gatheredSuffix
	gatheredSuffix = func() string { return suffix }
	return func() { gatheredSuffix = old }
}

// SetSearchRecordsHook makes f run after a search read segments'
// records and before their states (nil: nothing).
func SetSearchRecordsHook(f func()) { testHookSearchRecords = f }

// DueKeySegment returns the segment that due key kv of queue q names.
func DueKeySegment(c *Client, q string, kv *mvccpb.KeyValue) (string, int) {
	seg, n, _ := c.parseDue(q, string(kv.Key))
	return seg, n
}

// SetSegmentUnchangedHook makes f run when a change that read a task in a
// segment makes its compares (nil: nothing).
func SetSegmentUnchangedHook(f func()) { testHookSegmentUnchanged = f }

// SetSegmentSlotsHook makes f run after a read of tasks' index keys and
// before the read of their segments (nil: nothing).
func SetSegmentSlotsHook(f func()) { testHookSegmentSlots = f }
