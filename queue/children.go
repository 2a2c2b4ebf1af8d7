package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// Child tasks. A step of a step task (Steps) that returns task.Spawn has
// its children's plan and its checkpoint written under its claim (package
// task), and only then are the children submitted, each with its parent
// and parent step (Task.Parent, Task.ParentStep) and an id derived from
// them, so that a step run again submits nothing twice. A child's terminal
// outcome (SUCCEEDED, DEAD, CANCELLED; not a retry) writes its done key
// under the parent, in the same transaction as the outcome and fenced as
// it is. The parent meanwhile is parked; it is woken when its children's
// outcomes make its wait end (wakeParents), and the parked parent's own
// due time brings it back to count them in any case (childPoll), so that
// a worker that died between a child's outcome and the wake delays the
// parent, never strands it.

// Test hooks, set by tests before any worker starts (export_test.go); nil
// otherwise.
var (
	beforeChildSubmit func(parent string)
	beforeParentWake  func(parents []string)
)

// childSpawner submits the children of the step tasks a Client's workers
// run (task.Spawner).
type childSpawner struct{ c *Client }

var _ task.Spawner = childSpawner{}

// childTask is child c of step step of task parent as it is submitted.
func childTask(c task.Child, parent string, step int) Task {
	return Task{ID: c.ID, Type: c.Type, Parameters: c.Parameters, Metadata: Metadata{Priority: c.Priority},
		MaxRetries: c.MaxRetries, Timeout: Duration(c.Timeout), Queue: c.Queue, Parent: parent, ParentStep: step}
}

// CheckChildren implements task.Spawner: each child must be a valid task
// of a queue that exists (one submitted to or configured).
func (s childSpawner) CheckChildren(ctx context.Context, children []task.Child) error {
	now := s.c.now()
	queues := map[string]int{} // queue → the first child that names it
	for i, ch := range children {
		t := childTask(ch, "p", 1)
		if err := t.check(now); err != nil {
			var in *drover.InputError
			if errors.As(err, &in) {
				in.Field = fmt.Sprintf("children[%d].%s", i, in.Field)
				return in
			}
			return fmt.Errorf("children[%d]: %w", i, err)
		}
		if _, ok := queues[ch.Queue]; !ok {
			queues[ch.Queue] = i
		}
	}
	names := make([]string, 0, len(queues))
	for q := range queues {
		names = append(names, q)
	}
	slices.Sort(names)
	for len(names) > 0 {
		part := names[:min(100, len(names))]
		names = names[len(part):]
		ops := make([]clientv3.Op, len(part))
		for k, q := range part {
			ops[k] = clientv3.OpGet(s.c.keys.QueueName(q), clientv3.WithCountOnly())
		}
		resp, err := s.c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("queue: check the queues of children: %w", err)
		}
		for k, r := range resp.Responses {
			if r.GetResponseRange().Count == 0 {
				return &drover.InputError{Field: fmt.Sprintf("children[%d].queue", queues[part[k]]), Value: part[k],
					Rule: "names a queue that does not exist: submit to it or configure it (drover queues set) first"}
			}
		}
	}
	return nil
}

// SubmitChildren implements task.Spawner: the children go to their queues
// as any submission does, idempotently by id. The plan they come from is
// fixed by the parent's checkpoint, so whoever submits them (a worker run
// again, one that lost its claim since) submits the same tasks under the
// same ids, and the id index stores each once. A parent cancelled while
// its children were being submitted has the cancel's cascade run again
// here, so that no child submitted after the cascade stays live.
func (s childSpawner) SubmitChildren(ctx context.Context, parent string, step int, children []task.Child) error {
	if beforeChildSubmit != nil {
		beforeChildSubmit(parent)
	}
	byQueue := map[string][]Task{}
	var order []string
	for _, ch := range children {
		if _, ok := byQueue[ch.Queue]; !ok {
			order = append(order, ch.Queue)
		}
		byQueue[ch.Queue] = append(byQueue[ch.Queue], childTask(ch, parent, step))
	}
	for _, q := range order {
		res, err := s.c.Submit(ctx, q, byQueue[q], nil)
		if err != nil {
			return err
		}
		if len(res.Rejected) > 0 {
			return fmt.Errorf("queue %s refused child %s: %s", q, byQueue[q][res.Rejected[0].Line-1].ID, res.Rejected[0].Error)
		}
	}
	if t, err := s.c.Get(ctx, parent); err == nil && t.CurrentStatus == Cancelled {
		return errors.Join(fmt.Errorf("queue: task %s was cancelled while its children were submitted", parent), s.c.cancelChildren(ctx, parent))
	}
	return nil
}

// childDone is the value of a child's done key.
func childDone(status Status, result []byte, errMsg string) []byte {
	o := task.ChildOutcome{Status: string(status), Error: errMsg}
	switch {
	case len(result) == 0:
	case json.Valid(result):
		o.Result = result
	case utf8.Valid(result):
		o.Result, _ = json.Marshal(string(result))
	default:
		o.Result, _ = json.Marshal(result) // base64
	}
	b, _ := json.Marshal(o)
	return b
}

// childDoneOps are the writes that record child t's terminal outcome for
// its parent; none for a task without a parent. A child that succeeds
// after a requeue drops the failed mark its death left.
func (c *Client) childDoneOps(t *Task, status Status, result []byte, errMsg string) []clientv3.Op {
	if t.Parent == "" {
		return nil
	}
	ops := []clientv3.Op{clientv3.OpPut(c.keys.ChildDone(t.Parent, t.ParentStep, t.ID), string(childDone(status, result, errMsg)))}
	failed := c.keys.ChildFailed(t.Parent, t.ParentStep, t.ID)
	if status == Succeeded {
		return append(ops, clientv3.OpDelete(failed))
	}
	return append(ops, clientv3.OpPut(failed, ""))
}

// childResultError is the error of a child whose result is larger than
// its parent takes.
func childResultError(n int) error {
	return Permanent(fmt.Errorf("%w: %d bytes, over the %d bytes a child task's result may have", ErrResultLarge, n, task.MaxChildResult))
}

// parentsOf returns the distinct parents of the tasks of outcomes os that
// ended (not retried nor handed back).
func parentsOf(os []outcome) []string {
	var out []string
	for _, o := range os {
		switch t := o.c.task; {
		case t.Parent == "":
		case o.kind == Succeeded || o.kind == Dead:
			if !slices.Contains(out, t.Parent) {
				out = append(out, t.Parent)
			}
		}
	}
	return out
}

// wakeParents wakes each of parents whose wait for its children is over:
// a parent parked on its queue's sleep index goes back to pending now.
// A parent not parked yet (it is counting) or already back is left
// alone. Errors are logged: the parent's own due time brings it back.
func (c *Client) wakeParents(ctx context.Context, parents []string, logf func(msg string, args ...any)) {
	if beforeParentWake != nil {
		beforeParentWake(parents)
	}
	for _, p := range parents {
		w, ok, err := c.store.WaitOf(ctx, p)
		if err == nil && ok && w.Ready() {
			err = c.wakeSleeping(ctx, p)
		}
		if err != nil && ctx.Err() == nil {
			logf("queue: could not wake a parent task; it resumes at its next check", "task", p, "err", err)
		}
	}
}

// wakeSleeping moves task id from its queue's sleep index to pending, as
// the index does when it falls due; nothing when it is not parked there.
func (c *Client) wakeSleeping(ctx context.Context, id string) error {
	t, err := c.Get(ctx, id)
	if err != nil || t.CurrentStatus != Sleeping || t.seg != nil {
		if errors.Is(err, ErrNotFound) {
			return nil
		}
		return err
	}
	key := c.sleepKey(t)
	g, err := c.cli.Get(ctx, key)
	if err != nil || len(g.Kvs) == 0 {
		return err // moved already
	}
	var rv retryValue
	if err := json.Unmarshal(g.Kvs[0].Value, &rv); err != nil || rv.PendingKey == "" {
		return fmt.Errorf("sleep key %s is unreadable", key)
	}
	ops := []clientv3.Op{clientv3.OpDelete(key), clientv3.OpPut(rv.PendingKey, encodePending(rv.Attempts, false))}
	if lv := c.levelOfPending(t.Queue, rv.PendingKey); lv != "" {
		ops = append(ops, clientv3.OpPut(c.levelKey(t.Queue, lv), ""))
	}
	_, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", g.Kvs[0].ModRevision)).Then(ops...).Commit()
	return err
}

// childPoll is how soon a parent that waits for children counts them
// again on its own, however its wake went: a quarter of how long it has
// waited, from a second up to five minutes.
func childPoll(waited time.Duration) time.Duration {
	return min(max(waited/4, time.Second), 5*time.Minute)
}

// cancelChildren cancels the live children task parent spawned, except
// those spawned detached; each cancel cancels that child's own children.
// A child not submitted yet, or finished, is left as it is.
func (c *Client) cancelChildren(ctx context.Context, parent string) error {
	plans, err := c.store.Plans(ctx, parent)
	if err != nil || len(plans) == 0 {
		return err
	}
	var g errgroup.Group
	g.SetLimit(8)
	for _, children := range plans {
		for _, ch := range children {
			if ch.Detached {
				continue
			}
			g.Go(func() error {
				_, err := c.Cancel(ctx, ch.ID)
				if err == nil || errors.Is(err, ErrNotFound) || errors.Is(err, ErrFinished) {
					return nil
				}
				return fmt.Errorf("cancel child %s: %w", ch.ID, err)
			})
		}
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("queue: cancel the children of %s: %w", parent, err)
	}
	return nil
}

// afterCancels does for tasks, which a bulk cancel tried to cancel, what
// Cancel does after a cancel: it wakes the parents of those that are
// children, and cancels the children of those that spawned some (a count-
// only read per task tells, 100 a request). A task the bulk cancel did not
// cancel (it changed since it was read) is left alone: its record says so.
func (c *Client) afterCancels(ctx context.Context, tasks []*Task) error {
	var parents []string
	for _, t := range tasks {
		if t.Parent != "" && !slices.Contains(parents, t.Parent) {
			parents = append(parents, t.Parent)
		}
	}
	c.wakeParents(ctx, parents, func(string, ...any) {})
	for len(tasks) > 0 {
		part := tasks[:min(100, len(tasks))]
		tasks = tasks[len(part):]
		ops := make([]clientv3.Op, len(part))
		for i, t := range part {
			ops[i] = clientv3.OpGet(c.keys.ChildPlans(t.ID), clientv3.WithPrefix(), clientv3.WithCountOnly())
		}
		resp, err := c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("queue: find the children of cancelled tasks: %w", err)
		}
		for i, r := range resp.Responses {
			if r.GetResponseRange().Count == 0 {
				continue
			}
			if t, err := c.Get(ctx, part[i].ID); err != nil || t.CurrentStatus != Cancelled {
				continue
			}
			if err := c.cancelChildren(ctx, part[i].ID); err != nil {
				return err
			}
		}
	}
	return nil
}
