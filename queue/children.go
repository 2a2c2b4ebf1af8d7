package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// Child tasks. A step of a step task (Steps) that returns task.Spawn has
// its children's plan and its checkpoint written under its claim (package
// task), and only then are the children submitted, each with its parent,
// parent step and parent queue (Task.Parent, ParentStep, ParentQueue) and
// an id derived from them, so that a step run again submits nothing twice.
// The parent then parks WAITING (wait.go), conditionally: only if no child
// ended since it counted them (childParkConds). A child's terminal outcome
// (SUCCEEDED, DEAD, CANCELLED; not a retry) writes its done key under the
// parent in the same transaction as the outcome, fenced as it is, and puts
// its parent's wake mark (one key per parent, however many children end
// in one request); the workers of the parent's queue handle the marks
// (childWakerOf, below): they count the parent's children and wake it when its
// wait is over. The mark is written with the outcome, so a worker that
// dies after a child's outcome leaves the mark for another: the parent is
// woken late, never stranded.

// Test hooks, set by tests before any worker starts (export_test.go); nil
// otherwise.
var (
	beforeChildSubmit func(parent string)
	// beforeParentWake returning false skips the wake.
	beforeParentWake func(parent string) bool
	// beforeChildPark runs between a parent's count and its park.
	beforeChildPark func(parent string)
	// beforeCancelCascade runs between Cancel's cancel of a task and
	// that of its children.
	beforeCancelCascade func(parent string)
)

// childSpawner submits the children of the step tasks of queue q
// (task.Spawner).
type childSpawner struct {
	c *Client
	q string
}

var _ task.Spawner = childSpawner{}

// childTask is child c of step step of task parent, of queue pq, as it is
// submitted.
func childTask(c task.Child, parent string, step int, pq string) Task {
	return Task{ID: c.ID, Type: c.Type, Parameters: c.Parameters, Metadata: Metadata{Priority: c.Priority},
		MaxRetries: c.MaxRetries, Timeout: Duration(c.Timeout), Queue: c.Queue, Parent: parent, ParentStep: step, ParentQueue: pq}
}

// childFields names a child's fields as a spawn gives them, not as
// Task.check names a submitted task's.
var childFields = strings.NewReplacer("metadata.priority", "priority", "timeout/backoff", "timeout")

// CheckChildren implements task.Spawner: each child must be a valid task
// of a queue that exists (one submitted to or configured).
func (s childSpawner) CheckChildren(ctx context.Context, children []task.Child) error {
	now := s.c.now()
	queues := map[string]int{} // queue → the first child that names it
	for i, ch := range children {
		t := childTask(ch, "p", 1, s.q)
		if err := t.check(now); err != nil {
			var in *drover.InputError
			if errors.As(err, &in) {
				in.Field = fmt.Sprintf("children[%d].%s", i, childFields.Replace(in.Field))
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
		byQueue[ch.Queue] = append(byQueue[ch.Queue], childTask(ch, parent, step, s.q))
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
	if s.q == "" { // an agent task's: no queue task is its parent
		return nil
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
// its parent, and the key of its parent's wake mark (to put once per
// request: several children of one parent may end in one); none for a
// task without a parent. A child that succeeds after a requeue drops the
// failed mark its death left.
func (c *Client) childDoneOps(t *Task, status Status, result []byte, errMsg string) ([]clientv3.Op, string) {
	if t.Parent == "" {
		return nil, ""
	}
	ops := []clientv3.Op{clientv3.OpPut(c.keys.ChildDone(t.Parent, t.ParentStep, t.ID), string(childDone(status, result, errMsg)))}
	failed := c.keys.ChildFailed(t.Parent, t.ParentStep, t.ID)
	if status == Succeeded {
		ops = append(ops, clientv3.OpDelete(failed))
	} else {
		ops = append(ops, clientv3.OpPut(failed, ""))
	}
	return ops, c.childWakeKey(t)
}

// childDone is childDoneOps with the parent's wake mark added to markers,
// the keys an outcome request puts once.
func (w *Worker) childDone(t *Task, status Status, result []byte, errMsg string, markers map[string]bool) []clientv3.Op {
	ops, wake := w.client.childDoneOps(t, status, result, errMsg)
	if wake != "" {
		markers[wake] = true
	}
	return ops
}

// childCancelOps are the writes that record child t's cancel for its
// parent, without its wake mark (Cancel and CancelTasks put it).
func (c *Client) childCancelOps(t *Task) []clientv3.Op {
	ops, _ := c.childDoneOps(t, Cancelled, nil, "cancelled")
	return ops
}

// childWakeKey is the key of child t's parent's wake mark; "" for a task
// without a parent.
func (c *Client) childWakeKey(t *Task) string {
	if t.Parent == "" || t.ParentQueue == "" {
		return ""
	}
	return c.keys.ChildWake(t.ParentQueue, t.Parent)
}

// childParkConds are the compares under which a task that waits for
// children (cw; none when nil) may park: no child of the step ended since
// the revision at which the task counted them. An empty range satisfies
// it.
func (c *Client) childParkConds(id string, cw *task.ChildrenWait) []clientv3.Cmp {
	if cw == nil {
		return nil
	}
	return []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(c.keys.ChildDones(id, cw.Step)).WithPrefix(), "<", cw.Rev+1)}
}

// childResultError is the error of a child whose result is larger than
// its parent takes.
func childResultError(n int) error {
	return Permanent(fmt.Errorf("%w: %d bytes, over the %d bytes a child task's result may have", ErrResultLarge, n, task.MaxChildResult))
}

// wakeParent wakes task parent when it is parked waiting for its children
// and enough of them ended (or one failed it): what it waits for is read
// from its record, the children counted (one count-only read), and one
// transaction moves it back to pending while it is as read (Client.wake).
// A parent not parked on its children costs the record's read alone.
func (c *Client) wakeParent(ctx context.Context, parent string) (bool, error) {
	_, _, woke, err := c.wake(ctx, parent, nil, nil, func(t *Task) (bool, error) {
		if t.WaitingFor == nil || t.WaitingFor.Children == nil {
			return false, nil
		}
		ok, err := c.store.ChildrenReady(ctx, parent, *t.WaitingFor.Children)
		if err != nil || !ok {
			return false, err
		}
		return beforeParentWake == nil || beforeParentWake(parent), nil
	})
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return woke, err
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
				t, err := c.cancel(ctx, ch.ID)
				switch {
				case cancelCascades(t, err):
					err = c.cancelChildren(ctx, ch.ID) // its own, on the same context
				case errors.Is(err, ErrNotFound) || errors.Is(err, ErrFinished):
					return nil
				}
				if err != nil {
					return fmt.Errorf("cancel child %s: %w", ch.ID, err)
				}
				return nil
			})
		}
	}
	if err := g.Wait(); err != nil {
		return fmt.Errorf("queue: cancel the children of %s: %w", parent, err)
	}
	return nil
}

// afterCancels does for tasks, which a bulk cancel tried to cancel, what
// Cancel does after a cancel: it cancels the children of those that
// spawned some (a count-only read per task tells, 100 a request). A task
// the bulk cancel did not cancel (it changed since it was read) is left
// alone: its record says so.
func (c *Client) afterCancels(ctx context.Context, tasks []*Task) error {
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

// A child's terminal outcome puts its parent's wake mark,
// child-wakes/{q}/{parent}, in the same request (children.go). Every
// worker of queue q handles the marks of its queue's parents: it reads
// them, then watches them; for each it counts the parent's children and,
// when the parent's wait is over, wakes it (a fenced move back to pending,
// Client.wake); then it deletes the mark, only if no child put it again
// since. A mark whose handling failed stays, and is handled again at the
// next rescan. A mark is per parent, not per child: 10,000 children that
// end in a few hundred requests cost their parent a few hundred counts at
// most, fewer when they end faster than it is counted, since one count
// handles every put the watch delivered together.

// childRescan is how often a waker reads its marks again, for those whose
// handling failed.
const childRescan = 30 * time.Second

// childWakeWidth bounds the parents a waker handles at once.
const childWakeWidth = 8

// childWakerOf handles the wake marks of queue q's parents.
type childWakerOf struct {
	c      *Client
	q      string
	pre    string
	logger *slog.Logger
	logged atomic.Int64 // when a failure was last logged, Unix ns
}

// warn logs a failure, at most once a minute: an outage retried every
// few hundred milliseconds would otherwise fill the log.
func (k *childWakerOf) warn(msg string, args ...any) {
	now, last := time.Now().UnixNano(), k.logged.Load()
	if now-last > int64(time.Minute) && k.logged.CompareAndSwap(last, now) {
		k.logger.Warn(msg, args...)
	}
}

func (c *Client) childWaker(q string, logger *slog.Logger) *childWakerOf {
	return &childWakerOf{c: c, q: q, pre: c.keys.ChildWakes(q), logger: logger}
}

// run handles marks until ctx ends; after an error it waits a moment and
// starts again (a new read, a new watch), so an outage delays wakes but
// loses none.
func (k *childWakerOf) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := k.runOnce(ctx)
		if err == nil || ctx.Err() != nil {
			continue
		}
		k.warn("queue: waking parents of finished children failed; retrying", "queue", k.q, "err", err)
		_ = lifecycle.Sleep(ctx, time.Duration(100+rand.IntN(100))*time.Millisecond)
	}
}

// runOnce reads the marks and handles them, then handles those the watch
// delivers, until the watch fails or ctx ends.
func (k *childWakerOf) runOnce(ctx context.Context) error {
	g, err := k.c.cli.Get(ctx, k.pre, clientv3.WithPrefix())
	if err != nil {
		return fmt.Errorf("read the wake marks of %s: %w", k.q, err)
	}
	k.handle(ctx, g.Kvs)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := k.c.cli.Watch(clientv3.WithRequireLeader(wctx), k.pre, clientv3.WithPrefix(), clientv3.WithFilterDelete(), clientv3.WithRev(g.Header.Revision+1))
	rescan := time.NewTimer(childRescan)
	defer rescan.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-rescan.C:
			return nil // read them again
		case wr, ok := <-wch:
			if !ok {
				return fmt.Errorf("the watch of the wake marks of %s ended", k.q)
			}
			if err := wr.Err(); err != nil {
				return fmt.Errorf("watch the wake marks of %s: %w", k.q, err)
			}
			latest := map[string]*mvccpb.KeyValue{}
			for _, ev := range wr.Events {
				latest[string(ev.Kv.Key)] = ev.Kv
			}
			kvs := make([]*mvccpb.KeyValue, 0, len(latest))
			for _, kv := range latest {
				kvs = append(kvs, kv)
			}
			k.handle(ctx, kvs)
		}
	}
}

// handle handles marks kvs: each parent's wait is checked and, when over,
// the parent woken; the mark is then deleted unless put again since.
func (k *childWakerOf) handle(ctx context.Context, kvs []*mvccpb.KeyValue) {
	var g errgroup.Group
	g.SetLimit(childWakeWidth)
	for _, kv := range kvs {
		g.Go(func() error {
			parent := keyspace.Rest(k.pre, string(kv.Key))
			if _, err := k.c.wakeParent(ctx, parent); err != nil {
				if ctx.Err() == nil {
					k.warn("queue: could not wake a parent task; trying again later", "task", parent, "err", err)
				}
				return nil // the mark stays: the next rescan tries again
			}
			key := string(kv.Key)
			_, _ = k.c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).Then(clientv3.OpDelete(key)).Commit()
			return nil
		})
	}
	_ = g.Wait()
}
