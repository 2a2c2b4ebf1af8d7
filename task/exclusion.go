package task

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"

	"github.com/droverhq/drover/internal/segcodec"
	"github.com/droverhq/drover/keyspace"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitQueueClaim returns once no queue worker holds a claim on task id: a
// task id is run by one claimer at a time, a runner or a queue worker. The
// caller holds the task's lock, whose key keeps queue workers from claiming
// the task from now on (their claim requires the lock to have no holder and
// no waiter), so only a claim made before can exist; it ends when its task
// attempt does, or when its worker's lease does. waiting is told the queue
// when there is one to wait for. It returns early with the cause when held
// (the lock's context) ends, or with ctx's error.
func (s *Store) waitQueueClaim(ctx context.Context, id string, held context.Context, waiting func(queue string)) error {
	g, err := s.cli.Txn(ctx).Then(clientv3.OpGet(s.keys.TaskRecord(id)), clientv3.OpGet(s.keys.TaskIndex(id))).Commit()
	if err != nil {
		return fmt.Errorf("read task record: %w", err)
	}
	if len(g.Responses[0].GetResponseRange().Kvs) == 0 {
		if ix := g.Responses[1].GetResponseRange().Kvs; len(ix) > 0 {
			if at, ok := keyspace.ParseTaskPlace(string(ix[0].Value)); ok {
				return s.waitQueueRun(ctx, at, held, waiting)
			}
		}
		return nil // not a queued task
	}
	kvs := g.Responses[0].GetResponseRange().Kvs
	var rec struct {
		Queue string `json:"queue"`
	}
	if err := json.Unmarshal(kvs[0].Value, &rec); err != nil || rec.Queue == "" {
		return nil
	}
	claim := s.keys.QueueClaim(rec.Queue, id)
	told := false
	for {
		c, err := s.cli.Get(ctx, claim, clientv3.WithKeysOnly())
		if err != nil {
			return fmt.Errorf("read queue claim: %w", err)
		}
		if len(c.Kvs) == 0 {
			return nil
		}
		if !told {
			waiting(rec.Queue)
			told = true
		}
		if err := waitGone(ctx, held, s.cli, claim, c.Header.Revision); err != nil {
			return err
		}
	}
}

// waitQueueRun is waitQueueClaim for a task in a queue's segment: it
// returns once no run of the segment holds the task's slot (a run's value
// names its slots: segcodec.Run).
func (s *Store) waitQueueRun(ctx context.Context, at keyspace.TaskPlace, held context.Context, waiting func(queue string)) error {
	told := false
	for {
		g, err := s.cli.Get(ctx, s.keys.Runs(at.Queue, at.Segment), clientv3.WithPrefix())
		if err != nil {
			return fmt.Errorf("read queue runs: %w", err)
		}
		holder := ""
		for _, kv := range g.Kvs {
			if run, err := segcodec.DecodeRun(kv.Value); err == nil && slices.Contains(run.Slots, at.Slot) {
				holder = string(kv.Key)
			}
		}
		if holder == "" {
			return nil
		}
		if !told {
			waiting(at.Queue)
			told = true
		}
		if err := waitGone(ctx, held, s.cli, holder, g.Header.Revision); err != nil {
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
