package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/cascades"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/task"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
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
// (childWakerOf, wait.go): they count the parent's children and wake it when its
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
	// beforeCascadeRun runs as a cascade of an ended task begins.
	beforeCascadeRun func(parent string)
)

// childSpawner submits the children of the step tasks of queue q
// (task.Spawner).
type childSpawner struct {
	c *Client
	q string
}

var _ task.Spawner = childSpawner{}

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
	if err := s.checkChildIDs(ctx, children); err != nil {
		return err
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

// checkChildIDs refuses children whose ids another task has. A step's
// children are checked before its plan is stored, so that any task with
// a child's id then is not that child: one submitted by other means, or
// (were a child's id ever to come out equal to it) the parent itself or
// an ancestor. Submitted as a child, idempotently by id, such an id would
// store nothing, and the parent would wait on a task that never reports
// to it, or on itself. The ids of one step share a prefix (the parent's
// id and the step: task.ChildID), one prefix per length of key when the
// parent's id is cut: each prefix is counted in the id index (100 a
// request), and only a prefix that holds ids is listed and compared.
// This check reads; what enforces it is the submission's transaction,
// which stores a child only while its id's index key is absent (and its
// parent unsealed): an id taken between this read and the submission (a
// task submitted apart, another parent's child) leaves the task stored
// under it as it is, and makes that child a conflict (sameTask compares
// the parent), so that SubmitChildren fails.
func (s childSpawner) checkChildIDs(ctx context.Context, children []task.Child) error {
	at := map[string]int{} // child id → its position
	var pres []string
	seen := map[string]bool{}
	for i, ch := range children {
		at[ch.ID] = i
		key := ch.Key
		if key == "" {
			key = strconv.Itoa(i)
		}
		if pre := strings.TrimSuffix(ch.ID, key); !seen[pre] {
			seen[pre] = true
			pres = append(pres, pre)
		}
	}
	for len(pres) > 0 {
		part := pres[:min(100, len(pres))]
		pres = pres[len(part):]
		ops := make([]clientv3.Op, len(part))
		for k, pre := range part {
			ops[k] = clientv3.OpGet(s.c.keys.TaskIndex(pre), clientv3.WithPrefix(), clientv3.WithCountOnly())
		}
		resp, err := s.c.cli.Txn(ctx).Then(ops...).Commit()
		if err != nil {
			return fmt.Errorf("queue: check the ids of children: %w", err)
		}
		for k, r := range resp.Responses {
			if r.GetResponseRange().Count == 0 {
				continue
			}
			g, err := s.c.cli.Get(ctx, s.c.keys.TaskIndex(part[k]), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				return fmt.Errorf("queue: check the ids of children: %w", err)
			}
			for _, kv := range g.Kvs {
				id := keyspace.Rest(s.c.keys.TaskIndex(""), string(kv.Key))
				if i, ok := at[id]; ok {
					return &drover.InputError{Field: fmt.Sprintf("children[%d].key", i), Value: children[i].Key,
						Rule: fmt.Sprintf("gives the child the id %s, which another task has (not a child of this step): give the child a key of its own", id)}
				}
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
		return errors.Join(fmt.Errorf("queue: task %s was cancelled while its children were submitted", parent), s.c.cascade(ctx, s.q, parent))
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
// parent, without its wake mark (Cancel and CancelTasks put it). A
// cancel made by the parent's own cascade (cascaded) writes the done key
// alone, without the failed mark: the parent ended already, and were it
// requeued, the children its end cancelled would fail it again at once.
func (c *Client) childCancelOps(t *Task, cascaded bool) []clientv3.Op {
	ops, _ := c.childDoneOps(t, Cancelled, nil, "cancelled")
	if cascaded && len(ops) > 1 {
		ops = ops[:1]
	}
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
// those spawned detached, each under fence (the parent as its cascade
// read it: errParentChanged when it changed since); a child whose cancel
// put its own cascade mark (it spawned children) has its cascade run. A
// child not submitted yet, or finished, is left as it is. Finished
// children cost no request each: a step whose children all ended (a
// count of its done keys equals its plan's length) is skipped, and of the
// others only the children without a done key (their keys listed, keys
// only) are cancelled.
func (c *Client) cancelChildren(ctx context.Context, parent string, fence *cascadeFence) error {
	plans, err := c.store.Plans(ctx, parent)
	if err != nil || len(plans) == 0 {
		return err
	}
	var g errgroup.Group
	g.SetLimit(8)
	for step, children := range plans {
		live, err := c.liveChildren(ctx, parent, step, children)
		if err != nil {
			return err
		}
		for _, ch := range live {
			g.Go(func() error {
				t, marked, err := c.cancelBy(ctx, ch.ID, fence)
				switch {
				case err == nil && marked:
					err = c.cascade(ctx, t.Queue, ch.ID) // its own, on the same context
				case err == nil, errors.Is(err, ErrNotFound), errors.Is(err, ErrFinished):
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

// A task that ends CANCELLED (Cancel, CancelTasks) or DEAD (a worker's
// outcome, the fail-fast of a child that failed among them) puts its
// cascade mark, child-cascades/{q}/{id}, in the transaction that ends it,
// when it spawned children (cascadeMarkOp: a nested transaction that puts
// nothing for a task without a plan). Whoever ended it then cancels its
// live children (cascade) and removes the mark. One that dies, or whose
// requests fail, before the end of the cascade leaves the mark: the workers
// of the task's queue read their queue's marks at start and every
// cascadeRescan (cascadeScan) and finish the cascades left. A cascade is
// idempotent (a child cancelled or finished already is left as it is), so
// two that run at once cost reads, never a wrong state.

// cascadeMarkOp is the write that puts task t's cascade mark when t has a
// plan of children: one nested transaction, to go into the transaction
// that ends t CANCELLED or DEAD. It seals t's children too (ChildSealed):
// a submission of them compares the seal absent (putSegment), so a
// submitter that lost its claim to the end, and submits after the
// cascade looked, stores none; one that submitted before has its children
// found by the cascade.
func (c *Client) cascadeMarkOp(t *Task) clientv3.Op {
	// A compare over a prefix holds when every key under it holds it; an
	// empty prefix compares as one key never created, which fails "> 0".
	return clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.keys.ChildPlans(t.ID)).WithPrefix(), ">", 0)},
		[]clientv3.Op{clientv3.OpPut(c.keys.ChildCascade(t.Queue, t.ID), ""), clientv3.OpPut(c.keys.ChildSealed(t.ID), "")}, nil)
}

// cascade cancels the live children of task id, of queue q, when it is
// CANCELLED or DEAD (cancelChildren), then removes its cascade mark unless
// it was put again since it was read (before the cascade began). A task in
// another state (requeued since it ended) or gone has its mark removed and
// its children left alone.
func (c *Client) cascade(ctx context.Context, q, id string) error {
	mark := c.keys.ChildCascade(q, id)
	g, err := c.cli.Get(ctx, mark)
	if err != nil {
		return fmt.Errorf("queue: read the cascade mark of %s: %w", id, err)
	}
	t, err := c.Get(ctx, id)
	switch {
	case errors.Is(err, ErrNotFound):
	case err != nil:
		return err
	case t.CurrentStatus == Cancelled || t.CurrentStatus == Dead:
		if beforeCascadeRun != nil {
			beforeCascadeRun(id)
		}
		if err := c.cancelChildren(ctx, id, &cascadeFence{parent: id, rev: t.rev}); err != nil {
			return err // the mark stays; a parent requeued since has it dropped then
		}
	}
	if len(g.Kvs) == 0 {
		return nil
	}
	_, err = c.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(mark), "=", g.Kvs[0].ModRevision)).Then(clientv3.OpDelete(mark)).Commit()
	if err != nil {
		return fmt.Errorf("queue: remove the cascade mark of %s: %w", id, err)
	}
	return nil
}

// failFast reports whether outcome o ends a parent DEAD because one of its
// children failed it (the default policy of task.SpawnOptions): its other
// live children are cancelled once the outcome is written (cascadeDead).
func failFast(o outcome) bool {
	var cf *task.ChildFailedError
	return o.kind == Dead && errors.As(o.err, &cf)
}

// deadCascadeTimeout bounds a worker's cascade of one parent after the
// outcome that ended it DEAD; what it cuts short, cascadeScan finishes.
const deadCascadeTimeout = 30 * time.Second

// cascadeDead cancels the live children of parents ts, which their
// children's failures ended DEAD, once their outcomes (and cascade marks)
// are written: each with a budget of its own, all cut short when the
// worker is asked to stop (the marks stay for the scans).
func (w *Worker) cascadeDead(ts []*Task) {
	life, stop := context.WithCancel(w.cli.Ctx())
	defer stop()
	go func() {
		select {
		case <-w.stopReq:
			stop()
		case <-life.Done():
		}
	}()
	for _, t := range ts {
		ctx, cancel := context.WithTimeout(life, deadCascadeTimeout)
		err := w.client.cascade(ctx, t.Queue, t.ID)
		cancel()
		if err != nil && life.Err() == nil {
			w.logger.Warn("queue: could not cancel the children of a parent a child failed; the queue's workers finish it later", "task", t.ID, "err", err)
		}
	}
}

// cascadeRescan is how often the workers of a queue, and the HTTP
// servers, read the cascade marks (a variable for tests).
var cascadeRescan = 30 * time.Second

// cascadeScan finishes the cascades of queue q's tasks that their writers
// left, until ctx ends (package internal/cascades).
func (c *Client) cascadeScan(ctx context.Context, q string, logger *slog.Logger) {
	c.cascadeScanner(c.keys.ChildCascades(q), q, logger).Loop(ctx)
}

// ScanCascades finishes the cancel cascades left by the processes that
// wrote them, of every queue's tasks, until ctx ends: what a queue's own
// workers do for their queue (a queue whose workers all work over HTTP
// has none in process). Every scanner claims a mark before its cascade,
// so of several servers and workers one runs each.
func (c *Client) ScanCascades(ctx context.Context, logger *slog.Logger) {
	c.cascadeScanner(c.keys.ChildCascadesAll(), "", logger).Loop(ctx)
}

// cascadeScanner scans the marks under pre, of queue q ("": of every
// queue).
func (c *Client) cascadeScanner(pre, q string, logger *slog.Logger) *cascades.Scanner {
	return &cascades.Scanner{Cli: c.cli, Prefix: pre, Queue: q, Every: cascadeRescan, Hold: cancelCascadeTimeout,
		Now: c.now, Run: c.cascade, Logger: logger}
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
			if err := c.cascade(ctx, part[i].Queue, part[i].ID); err != nil {
				return err
			}
		}
	}
	return nil
}

// ErrParentEnded is matched by the error of a submission of children
// whose parent ended CANCELLED or DEAD: nothing of it was stored.
var ErrParentEnded = errors.New("queue: the parent task ended")

// sealCompares adds to cmps, for each parent of the children among
// valid[idx], the compare that its children are not sealed, and to gets
// the read of its seal; it returns the parents, in that order.
func (c *Client) sealCompares(valid []Task, idx []int, cmps *[]clientv3.Cmp, gets *[]clientv3.Op) []string {
	var parents []string
	for _, i := range idx {
		if p := valid[i].Parent; p != "" && valid[i].ParentQueue != "" && !slices.Contains(parents, p) {
			parents = append(parents, p)
			key := c.keys.ChildSealed(p)
			*cmps = append(*cmps, clientv3.Compare(clientv3.CreateRevision(key), "=", 0))
			*gets = append(*gets, clientv3.OpGet(key, clientv3.WithCountOnly()))
		}
	}
	return parents
}

// maxSeals bounds the parents whose seals one segment's transaction
// compares, within etcd's 128 compares beside a compare per task.
const maxSeals = 20

// sealCut is where the tasks valid[idx] are split in two segments so that
// the first holds the children of maxSeals parents at most; 0: no split.
func sealCut(valid []Task, idx []int) int {
	seen := map[string]bool{}
	for k, i := range idx {
		if p := valid[i].Parent; p != "" && valid[i].ParentQueue != "" && !seen[p] {
			if len(seen) == maxSeals {
				return k
			}
			seen[p] = true
		}
	}
	return 0
}

// sealedError is the error of a submission refused because a parent of
// its children (parents, their seals read in rs) ended; nil when none did.
func sealedError(parents []string, rs []*etcdserverpb.ResponseOp) error {
	for k, p := range parents {
		if k < len(rs) && rs[k].GetResponseRange().Count > 0 {
			return fmt.Errorf("%w: task %s was cancelled or is dead: its children are not submitted", ErrParentEnded, p)
		}
	}
	return nil
}
