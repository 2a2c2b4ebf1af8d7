package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// stepClaim is the claim of the task whose step (drover task run) runs
// this command, as the writer of its stream: found from DROVER_TASK_ID and
// DROVER_LOCK_TOKEN, which the step's environment holds. The claim is the
// task's etcd lock held with the token, or, with another lock backend,
// the task's fence key at the token. An error matching lease.ErrFenced
// says it is held so no more.
func stepClaim(ctx context.Context, cli *clientv3.Client, keys keyspace.Space, id, tokenText string) (stream.Claim, error) {
	token, err := strconv.ParseInt(tokenText, 10, 64)
	if err != nil || token < 1 {
		return stream.Claim{}, usageError{fmt.Errorf("$%s is %q: not a lock's token", EnvLockToken, tokenText)}
	}
	if err := task.CheckID(id); err != nil {
		return stream.Claim{}, usageError{err}
	}
	name := keyspace.TaskLock(id)
	r, err := cli.Txn(ctx).Then(clientv3.OpGet(keys.Lock(name), clientv3.WithFirstCreate()...), clientv3.OpGet(keys.TaskFence(id))).Commit()
	if err != nil {
		return stream.Claim{}, fmt.Errorf("read the claim of task %s: %w", id, err)
	}
	held, fence := r.Responses[0].GetResponseRange().Kvs, r.Responses[1].GetResponseRange().Kvs
	var f stepFence
	var worker string
	switch {
	case len(held) > 0 && held[0].CreateRevision == token:
		f = stepFence{token: token, cmps: []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(string(held[0].Key)), "=", token)}}
		var h lock.Holder
		_ = json.Unmarshal(held[0].Value, &h)
		worker = h.ID
	case len(fence) > 0 && string(fence[0].Value) == lease.PadToken(token):
		f = stepFence{token: token, cmps: []clientv3.Cmp{task.TokenFenceCmp(keys.TaskFence(id), token)}}
	default:
		return stream.Claim{}, fmt.Errorf("%w: task %s is not held with token %d (it was taken over, or its run ended)", lease.ErrFenced, id, token)
	}
	n, _, _, err := stream.For(cli, keys).NextAttempt(ctx, id, token)
	if err != nil {
		return stream.Claim{}, err
	}
	return stream.Claim{Task: id, Attempt: n, Worker: worker, Fence: f}, nil
}

// stepFence is a step's claim as its stream's fence.
type stepFence struct {
	token int64
	cmps  []clientv3.Cmp
}

func (f stepFence) Token() int64             { return f.token }
func (f stepFence) Compares() []clientv3.Cmp { return f.cmps }
func (f stepFence) Err() error               { return nil }

// endsStream is the option of a follower of task id that ends it once
// the task ended: a queue's task SUCCEEDED, DEAD or CANCELLED (or gone),
// an agent task (no queue's) completed.
func endsStream(c *queue.Client, cli *clientv3.Client, ns, id string) stream.FollowOption {
	store, err := task.NewStore(cli, ns)
	return stream.WhenEndedAt(func(ctx context.Context) (time.Time, bool) {
		t, gerr := c.Get(ctx, id)
		switch {
		case gerr == nil:
			return t.EndedAt(), t.CurrentStatus.Terminal()
		case !errors.Is(gerr, queue.ErrNotFound) || err != nil:
			return time.Time{}, false
		}
		cp, lerr := store.Load(ctx, id)
		if lerr == nil && cp.Completed {
			return cp.At, true // its completing checkpoint's time
		}
		return time.Time{}, lerr == nil && cp.At.IsZero() && !agentTaskKnown(ctx, cli, ns, id)
	}, 0)
}

// agentTaskKnown says whether agent task id has a checkpoint, a claim
// or a stream.
func agentTaskKnown(ctx context.Context, cli *clientv3.Client, ns, id string) bool {
	keys, err := keyspace.New(ns)
	if err != nil {
		return false
	}
	r, err := cli.Txn(ctx).Then(
		clientv3.OpGet(keys.StreamChunks(id), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(keys.TaskCheckpoint(id), clientv3.WithCountOnly()),
		clientv3.OpGet(keys.Lock(keyspace.TaskLock(id)), clientv3.WithPrefix(), clientv3.WithCountOnly()),
	).Commit()
	if err != nil {
		return false
	}
	for _, op := range r.Responses {
		if op.GetResponseRange().Count > 0 {
			return true
		}
	}
	return false
}
