package taskstore

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// One holder per task id: a task id is run by one claimer at a time, a
// queue worker or a task runner (package task). Each side keeps the rule
// against the other's keys:
//
//   - a queue's claim (of a task with a record of its own, or a run of a
//     segment's slots) is made only while the runner's lock on the id has
//     no holder and no waiter: NoRunner, with the lock's keys from
//     RunnerLock;
//   - a runner that holds the lock waits, before it runs, for a queue's
//     hold made earlier to end: FindQueueHold, then QueueHold.Holder until
//     it names none. The hold is the task's claim key when the task has a
//     record of its own, else the run of its segment whose value names its
//     slot.

// RunnerLock is the prefix of the keys of the runner's lock on task id
// (its holder's and its waiters').
func RunnerLock(keys keyspace.Space, id string) string { return keys.Lock(keyspace.TaskLock(id)) }

// NoRunner is the compare that the runner's lock whose keys start with
// lock (RunnerLock) has no holder and no waiter.
func NoRunner(lock string) clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(lock), "=", 0).WithPrefix()
}

// CountRunners reads how many keys the runner's lock whose keys start
// with lock has: more than none says a runner holds or waits for the task.
func CountRunners(lock string) clientv3.Op {
	return clientv3.OpGet(lock, clientv3.WithPrefix(), clientv3.WithCountOnly())
}

// QueueHold is where a queue's hold on one task id may be: the claim key
// of a task with a record of its own, or the runs of the segment that
// holds the task in a slot.
type QueueHold struct {
	// Queue is the task's queue.
	Queue string
	claim string // the claim key, or "" for a task in a segment
	runs  string // the prefix of the segment's runs
	slot  int
}

// FindQueueHold reads where a queue's hold on task id may be; ok false
// says id is not a queued task (nothing to wait for).
func FindQueueHold(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, id string) (QueueHold, bool, error) {
	g, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.TaskRecord(id)), clientv3.OpGet(keys.TaskIndex(id))).Commit()
	if err != nil {
		return QueueHold{}, false, fmt.Errorf("read task record: %w", err)
	}
	kvs := g.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		if ix := g.Responses[1].GetResponseRange().Kvs; len(ix) > 0 {
			if at, ok := keyspace.ParseTaskPlace(string(ix[0].Value)); ok {
				return QueueHold{Queue: at.Queue, runs: keys.Runs(at.Queue, at.Segment), slot: at.Slot}, true, nil
			}
		}
		return QueueHold{}, false, nil
	}
	var rec struct {
		Queue string `json:"queue"`
	}
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil || rec.Queue == "" {
		return QueueHold{}, false, nil
	}
	return QueueHold{Queue: rec.Queue, claim: keys.QueueClaim(rec.Queue, id)}, true, nil
}

// Holder reads the key that holds the task now, "" when none does, and
// the revision of the read (to watch the key's deletion from).
func (h QueueHold) Holder(ctx context.Context, cli *clientv3.Client) (key string, rev int64, err error) {
	if h.claim != "" {
		c, err := cli.Get(ctx, h.claim, clientv3.WithKeysOnly())
		if err != nil {
			return "", 0, fmt.Errorf("read queue claim: %w", err)
		}
		if len(c.Kvs) == 0 {
			return "", c.Header.Revision, nil
		}
		return h.claim, c.Header.Revision, nil
	}
	g, err := cli.Get(ctx, h.runs, clientv3.WithPrefix())
	if err != nil {
		return "", 0, fmt.Errorf("read queue runs: %w", err)
	}
	for _, kv := range g.Kvs {
		if run, err := DecodeRun(kv.Value); err == nil && slices.Contains(run.Slots, h.slot) {
			key = string(kv.Key)
		}
	}
	return key, g.Header.Revision, nil
}
