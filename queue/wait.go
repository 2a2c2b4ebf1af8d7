package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/due"
	"github.com/droverhq/drover/internal/lifecycle"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"golang.org/x/sync/errgroup"
)

// A step task that waits (a step ended with task.WaitSignal) is parked as
// a sleeping one is (sleep.go): its outcome, fenced by its claim, gives the
// claim up, says WAITING in its record, with what it waits for
// (WaitingFor), and puts one key in its queue's wait index,
// queues/{q}/wait/{due}-{id}, due at the wait's timeout (NoTimeout when it
// has none), holding where the task goes back to (waitPending). The same
// due.Index code moves it back to pending when the timeout passes; a
// signal moves it back at once (wake). The park is conditional: a nested
// transaction that parks only if nothing the task waits for has come
// already (parkConds), and otherwise hands the task back at once, so that
// a signal sent just before the park is never missed.

// NoTimeout is the due time of a wait without a timeout in its queue's
// wait index: far enough that no mover reaches it, within the Unix
// nanoseconds a due key holds.
var NoTimeout = time.Date(2200, 1, 1, 0, 0, 0, 0, time.UTC)

// MaxSignalData bounds a signal's data, in bytes of JSON.
const MaxSignalData = task.MaxSignalData

// MaxInboxSignals bounds the signals that wait unconsumed in one task's
// inbox: a send past it is refused (ErrInboxFull), so that an inbox no
// step consumes does not grow without end.
const MaxInboxSignals = 1000

// ErrInboxFull: the task's inbox holds MaxInboxSignals signals not yet
// consumed; the signal was not stored.
var ErrInboxFull = errors.New("queue: the task's inbox is full")

// WaitingFor is what a WAITING task waits for, as its record says: the
// wait its step's checkpoint holds (task.Wait), with Children set when it
// waits for the children a step spawned rather than for a signal.
type WaitingFor = task.Wait

// waitDue is when a wait falls due in the wait index: its timeout, or
// NoTimeout.
func waitDue(w *task.Wait) time.Time {
	if w.Until.IsZero() {
		return NoTimeout
	}
	return w.Until
}

// waitingKey is the task's key in its queue's wait index.
func (c *Client) waitingKey(t *Task) string {
	return due.Key(c.keys.QueueWait(t.Queue), t.ScheduledAt, t.ID)
}

// waitIndex is queue q's waiting tasks as a due index: a wait that times
// out goes back to pending as a due retry does (the same writes), judged
// by the client's clock.
func (c *Client) waitIndex(q string, logger *slog.Logger) *due.Index {
	ix := c.retryIndex(q, logger)
	ix.Prefix, ix.Now, ix.Name = c.keys.QueueWait(q), c.now, "wait"
	ix.Move = func(kv *mvccpb.KeyValue) ([]clientv3.Op, bool) {
		pk, attempts, ok := c.waitPending(q, kv)
		if !ok {
			logger.Error("queue: dropping an unreadable wait key", "key", string(kv.Key))
			return nil, false
		}
		return []clientv3.Op{clientv3.OpPut(pk, encodePending(attempts, false))}, true
	}
	ix.Shared = func(kvs []*mvccpb.KeyValue) []clientv3.Op {
		var markers []clientv3.Op
		levels := map[string]bool{}
		for _, kv := range kvs {
			pk, _, ok := c.waitPending(q, kv)
			if !ok {
				continue
			}
			if lv := c.levelOfPending(q, pk); lv != "" && !levels[lv] {
				levels[lv] = true
				markers = append(markers, clientv3.OpPut(c.levelKey(q, lv), ""))
			}
		}
		return markers
	}
	return ix
}

// shortWaitValues says whether parks write wait keys' values in their
// short form (waitValue), as they do: about 50 bytes less a parked task
// than a retry key's JSON. Every binary reads both forms; one built before
// the short form was read (2026-11-28) reads only the JSON, and its wait
// mover would drop a short key it cannot read when the wait times out,
// leaving the task WAITING with no key: do not run one beside this one. A
// variable for the tests of the JSON form, which older parks wrote.
var shortWaitValues = true

// waitValue is the short form of what task id's wait key holds, in queue q: the attempts it
// started and where it goes back to, "{attempts} {pending}", where
// pending is its pending key without the queue's pending prefix and the
// "-{id}" that ends it (the wait key holds both): about 25 bytes, where a
// retry key's JSON (retryValue) takes about 80. A pending key of another
// form is kept whole, as a retry key's JSON.
func (c *Client) waitValue(q, id, pendingKey string, attempts int) string {
	rest, ok := strings.CutPrefix(pendingKey, c.keys.QueuePending(q))
	if rest, cut := strings.CutSuffix(rest, "-"+id); ok && cut && !strings.HasPrefix(rest, "{") {
		return strconv.Itoa(attempts) + " " + rest
	}
	rv, _ := json.Marshal(retryValue{PendingKey: pendingKey, Attempts: attempts})
	return string(rv)
}

// waitPending reads wait key kv of queue q: the pending key its task goes
// back to, and the attempts it started; false when kv is unreadable. It
// reads the JSON of a retry key too (what binaries before waitValue
// wrote).
func (c *Client) waitPending(q string, kv *mvccpb.KeyValue) (string, int, bool) {
	if len(kv.Value) > 0 && kv.Value[0] == '{' {
		var rv retryValue
		if json.Unmarshal(kv.Value, &rv) != nil || rv.PendingKey == "" {
			return "", 0, false
		}
		return rv.PendingKey, rv.Attempts, true
	}
	_, id, ok := due.Parse(c.keys.QueueWait(q), string(kv.Key))
	a, rest, cut := strings.Cut(string(kv.Value), " ")
	attempts, err := strconv.Atoi(a)
	if !ok || !cut || err != nil || rest == "" {
		return "", 0, false
	}
	return c.keys.QueuePending(q) + rest + "-" + id, attempts, true
}

// parkConds are the compares under which task id may be parked waiting
// for wf: nothing it waits for has come. For each signal name, no key in
// the task's inbox under that name (a compare over the name's prefix,
// which an empty range satisfies), or, with before > 0, none stored after
// revision before (an outcome that consumes signals it names: the inbox
// held only those at before). What else a task waits for adds compares.
func (c *Client) parkConds(id string, wf *WaitingFor, before int64) []clientv3.Cmp {
	cmps := make([]clientv3.Cmp, 0, len(wf.Signals))
	for _, n := range wf.Signals {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.keys.TaskSignalName(id, n)), "<", before+1).WithPrefix())
	}
	return append(cmps, c.childParkConds(id, wf.Children)...)
}

// waitOps are the writes that record outcome o, a wait: one nested
// transaction that, under parkConds, parks the task (its record WAITING,
// its attempt given back, its key in the wait index) and otherwise hands
// it back to pending at once, its attempt given back too (what it waits
// for came before the park: its next run delivers it). ops are the writes
// recordOps made before (the claim's deletion); no key is written both
// there and in the nested transaction, as etcd requires.
func (w *Worker) waitOps(o outcome, pendingKey string, seg bool, now time.Time, ops []clientv3.Op, markers map[string]bool) ([]clientv3.Op, int) {
	t := o.c.task
	back := *t
	back.Transitions = slices.Clone(t.Transitions)
	t.Transitions = appendLost(t.Transitions, t.Attempt, o.c.claimedAt)
	if !o.repark || !waitedBefore(t) {
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Running, At: o.c.claimedAt, Attempt: t.Attempt, Worker: w.worker})
		t.Transitions = appendTransition(t.Transitions, Transition{Status: Waiting, At: waitedAt(o.wait, o.c.claimedAt, now), Attempt: t.Attempt, Worker: w.worker, Error: waitText(o.wait)})
	}
	t.Attempt-- // a wait is not an attempt
	t.CurrentStatus, t.ScheduledAt, t.Token = Waiting, o.until.UTC(), o.c.token
	t.WaitingFor = o.wait
	rv, _ := json.Marshal(retryValue{PendingKey: pendingKey, Attempts: t.Attempt})
	if shortWaitValues {
		rv = []byte(w.client.waitValue(t.Queue, t.ID, pendingKey, t.Attempt))
	}
	t.WaitingFor = storedWait(t)
	rec, _ := json.Marshal(t)
	t.WaitingFor = o.wait
	var park []clientv3.Op
	if !seg {
		park = append(park, clientv3.OpDelete(pendingKey))
	}
	park = append(park, clientv3.OpPut(w.client.waitingKey(t), string(rv)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(rec)))
	park = append(park, o.spend.consume()...) // parked only: handed back, the next claim resumes where this one did
	// Handed back, it keeps the wait its claim resumed at (WaitingFor).
	back.CurrentStatus, back.Attempt, back.Token = Pending, back.Attempt-1, 0
	brec, _ := json.Marshal(&back)
	handBack := []clientv3.Op{clientv3.OpPut(pendingKey, encodePending(back.Attempt, false)), clientv3.OpPut(w.keys.TaskRecord(t.ID), string(brec))}
	if seg {
		markers[w.client.levelKey(t.Queue, levelOf(t.Metadata.Priority))] = true
	}
	return append(ops, clientv3.OpTxn(w.client.parkConds(t.ID, t.WaitingFor, o.spend.before()), park, handBack)), len(rec) + len(brec) + 600
}

// storedWait is task t's WaitingFor as its record stores it: when the
// wait began and when it times out left to its WAITING transition's time
// and its ScheduledAt when they say the same (a read of the task puts
// them back, readTasks), about 80 bytes less a parked task.
func storedWait(t *Task) *WaitingFor { return t.WaitingFor.Stored(t.waitBounds()) }

// waitBounds are when task t's wait began and when it times out as the
// rest of its record says: its last WAITING transition's time, and its
// ScheduledAt (zero when that is NoTimeout).
func (t *Task) waitBounds() (since, until time.Time) {
	for i := len(t.Transitions) - 1; i >= 0; i-- {
		if t.Transitions[i].Status == Waiting {
			since = t.Transitions[i].At
			break
		}
	}
	if !t.ScheduledAt.Equal(NoTimeout) {
		until = t.ScheduledAt
	}
	return since, until
}

// waitedAt is the time of the WAITING transition of wait wt, parked at
// now by an attempt claimed at claimed: when the wait began, so that the
// record need not say it twice, unless that is outside the attempt.
func waitedAt(wt *task.Wait, claimed, now time.Time) time.Time {
	if wt.Since.IsZero() || wt.Since.Before(claimed) || wt.Since.After(now) {
		return now
	}
	return wt.Since
}

// waitText says in a transition what a task waits for (its record's
// WaitingFor says until when).
func waitText(wt *task.Wait) string {
	if cw := wt.Children; cw != nil {
		return fmt.Sprintf("waits for %d of the %d children step %d spawned", cw.Wait, cw.N, cw.Step)
	}
	return "waits for signal " + strings.Join(wt.Signals, " or ")
}

// waitedBefore reports whether task t's history shows it waiting.
func waitedBefore(t *Task) bool {
	for _, tr := range t.Transitions {
		if tr.Status == Waiting {
			return true
		}
	}
	return false
}

// wakeTxn are the compares and writes that move task t, parked WAITING
// with its wait key kv (as read), back to pending at once: the wait
// index's own move of kv (the key deleted, the pending key and its level's
// marker put), under the compares that the record and the key are still
// as read. false: kv cannot be moved (unreadable), nothing to do. Whatever
// makes a waiting task's condition true (a signal here) makes these writes
// in the transaction that makes it true.
func (c *Client) wakeTxn(t *Task, kv *mvccpb.KeyValue) ([]clientv3.Cmp, []clientv3.Op, bool) {
	ix := c.waitIndex(t.Queue, slog.Default())
	moves, ok := ix.Move(kv)
	if !ok {
		return nil, nil, false
	}
	cmps := []clientv3.Cmp{
		clientv3.Compare(clientv3.ModRevision(c.keys.TaskRecord(t.ID)), "=", t.rev),
		clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision),
	}
	ops := append([]clientv3.Op{clientv3.OpDelete(string(kv.Key))}, moves...)
	return cmps, append(ops, ix.Shared([]*mvccpb.KeyValue{kv})...), true
}

// waiting reads task id and, when its record says WAITING, its key in the
// wait index (nil when the task is not parked: it was woken, or it never
// parked). A task that does not exist is ErrNotFound.
func (c *Client) waiting(ctx context.Context, id string) (*Task, *mvccpb.KeyValue, error) {
	t, err := c.Get(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if t.CurrentStatus != Waiting {
		return t, nil, nil
	}
	g, err := c.cli.Get(ctx, c.waitingKey(t))
	if err != nil {
		return nil, nil, fmt.Errorf("queue: read the wait of %s: %w", id, err)
	}
	if len(g.Kvs) == 0 {
		return t, nil, nil
	}
	return t, g.Kvs[0], nil
}

// wakeTries bounds wake's reads and writes when the task keeps changing
// under it.
const wakeTries = 20

// wake reads task id and commits, while the task is as read (its record,
// its key in the wait index), one nested transaction If(more)
// Then(also, and, when the task is parked and wakes says what it waits for
// has come, the wake's writes: back to pending at once). A task read that
// changed before the commit is read again (at most wakeTries times).
// wakes may refuse the task as read with an error, which wake returns.
// It returns the task as read, whether the nested transaction's compares
// held (its writes were made), and whether the task was woken. What makes
// a waiting task's condition true (a signal here) calls it with the
// writes that make it true; those (also) grow the store, so that a full
// store refuses them (*drover.StoreFullError) as it refuses submissions.
func (c *Client) wake(ctx context.Context, id string, more []clientv3.Cmp, also []clientv3.Op, wakes func(*Task) (bool, error)) (*Task, bool, bool, error) {
	for try := 0; try < wakeTries; try++ {
		if try > 0 {
			sleepCtx(ctx, time.Duration(try)*5*time.Millisecond)
		}
		t, kv, err := c.waiting(ctx, id)
		if err != nil {
			return nil, false, false, err
		}
		yes, err := wakes(t)
		if err != nil {
			return t, false, false, err
		}
		// The task as read: its record (an outcome that parks it
		// rewrites it) and its wait key.
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(c.keys.TaskRecord(id)), "=", t.rev)}
		then := slices.Clone(also)
		woke := false
		switch {
		case kv == nil:
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(c.waitingKey(t)), "=", 0))
		case yes:
			if wc, wops, ok := c.wakeTxn(t, kv); ok {
				cmps, then, woke = wc, append(then, wops...), true
				break
			}
			fallthrough
		default:
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
		}
		if len(then) == 0 {
			return t, false, false, nil // nothing to write: not woken, nothing given
		}
		if len(also) > 0 {
			cmps = append(cmps, storeguard.NotFull(c.keys))
		}
		resp, err := c.cli.Txn(ctx).If(cmps...).Then(clientv3.OpTxn(more, then, nil)).Else(storeguard.GetOp(c.keys)).Commit()
		if err != nil {
			return nil, false, false, err
		}
		if !resp.Succeeded {
			if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil && len(also) > 0 {
				return t, false, false, err
			}
			continue // the task changed since it was read
		}
		done := resp.Responses[0].GetResponseTxn().Succeeded
		return t, done, woke && done, nil
	}
	return nil, false, false, errors.New("the task kept changing; try again")
}

// Signal sends the signal name, with data (JSON; nil or empty: none), to
// task id, under idempotency key idem ("" means a random one). It is
// stored in the task's inbox until a step that waits for it (see
// task.WaitSignal) consumes it; when the task is parked waiting for it,
// the same transaction moves it back to pending, and any worker of its
// queue resumes it. A signal sent before the task waits is kept and
// delivered to the wait. A signal sent again with the same name and
// idempotency key stores and delivers nothing (Stored false). A task
// that does not exist is ErrNotFound; one that is finished, ErrFinished.
// A named task (task.Runner, HTTP agent tasks: no queue, a checkpoint)
// takes signals too: nothing is parked, its next run delivers them.
func (c *Client) Signal(ctx context.Context, id, name string, data json.RawMessage, idem string) (_ SignalResult, err error) {
	ctx, span := otelspan.StartSignal(ctx, c.tracer, c.keys.Namespace(), id, name)
	defer func() { otelspan.End(span, err) }()
	if err := task.CheckSignal(id, name, data, idem); err != nil {
		return SignalResult{}, err
	}
	if idem == "" {
		idem = newIdempotencyKey()
	}
	in, seen := c.keys.TaskSignal(id, name, idem), c.keys.TaskSignalSeen(id, name, idem)
	isNew, err := c.inboxRoom(ctx, id, in, seen)
	if err != nil {
		return SignalResult{IdempotencyKey: idem}, err
	}
	fresh := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(in), "=", 0), clientv3.Compare(clientv3.CreateRevision(seen), "=", 0)}
	var put []clientv3.Op // a send again writes nothing: no store-full guard
	if isNew {
		put = []clientv3.Op{clientv3.OpPut(in, task.EncodeSignal(data, c.now()))}
	}
	t, stored, woke, err := c.wake(ctx, id, fresh, put, func(t *Task) (bool, error) {
		if t.CurrentStatus.Terminal() {
			return false, fmt.Errorf("%w: task %s is %s: it takes no signal", ErrFinished, id, t.CurrentStatus)
		}
		return isNew && t.WaitingFor != nil && slices.Contains(t.WaitingFor.Signals, name), nil
	})
	if errors.Is(err, drover.ErrStoreFull) {
		return SignalResult{IdempotencyKey: idem}, err
	}
	if errors.Is(err, ErrNotFound) { // perhaps a named task (task.Runner, agent tasks): no queue, nothing to wake
		var named Status
		named, stored, err = c.signalNamed(ctx, id, fresh, put)
		t = &Task{CurrentStatus: named}
	}
	if err != nil {
		if errors.Is(err, ErrFinished) || errors.Is(err, ErrNotFound) || errors.Is(err, drover.ErrStoreFull) {
			return SignalResult{IdempotencyKey: idem}, err
		}
		return SignalResult{}, fmt.Errorf("queue: signal %s of task %s: %w", name, id, err)
	}
	return SignalResult{IdempotencyKey: idem, Stored: stored, Woke: woke, Status: t.CurrentStatus}, nil
}

// inboxRoom reports whether the signal (inbox key in, its tombstone
// seen) to task id is new (neither stored nor consumed), refusing a new
// one with ErrInboxFull when the inbox holds MaxInboxSignals signals not
// yet consumed (concurrent sends may pass it by a few). Only a new
// signal's writes compare the store-full guard (wake, signalNamed),
// after a finished task was refused: a send again writes nothing.
func (c *Client) inboxRoom(ctx context.Context, id, in, seen string) (bool, error) {
	g, err := c.cli.Txn(ctx).Then(clientv3.OpGet(c.keys.TaskSignals(id), clientv3.WithPrefix(), clientv3.WithCountOnly()),
		clientv3.OpGet(in, clientv3.WithCountOnly()), clientv3.OpGet(seen, clientv3.WithCountOnly())).Commit()
	if err != nil {
		return false, fmt.Errorf("queue: read the inbox of %s: %w", id, err)
	}
	n := func(i int) int64 { return g.Responses[i].GetResponseRange().Count }
	isNew := n(1) == 0 && n(2) == 0
	if isNew && n(0) >= MaxInboxSignals {
		return true, fmt.Errorf("%w: task %s holds %d signals not yet consumed, the most a task's inbox holds (%d); send more once its steps consumed some",
			ErrInboxFull, id, n(0), MaxInboxSignals)
	}
	return isNew, nil
}

// signalNamed stores a signal (writes put under compares fresh) for task
// id that has no queue but a checkpoint (a named task: task.Runner, HTTP
// agent tasks), which parks nowhere: its next run delivers the signal. No
// checkpoint: ErrNotFound; a completed one: ErrFinished. The status it
// returns is RUNNING for a task not completed.
func (c *Client) signalNamed(ctx context.Context, id string, fresh []clientv3.Cmp, put []clientv3.Op) (Status, bool, error) {
	key := c.keys.TaskCheckpoint(id)
	for try := 0; try < wakeTries; try++ {
		g, err := c.cli.Get(ctx, key)
		if err != nil {
			return "", false, err
		}
		if len(g.Kvs) == 0 {
			return "", false, fmt.Errorf("%w: %s", ErrNotFound, id)
		}
		var cp struct {
			Completed bool `json:"completed"`
		}
		if json.Unmarshal(g.Kvs[0].Value, &cp) == nil && cp.Completed {
			return Succeeded, false, fmt.Errorf("%w: task %s is completed: it takes no signal", ErrFinished, id)
		}
		cmps := []clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(key), "=", g.Kvs[0].ModRevision)}
		if len(put) > 0 { // a send again (nothing to put) writes nothing
			cmps = append(cmps, storeguard.NotFull(c.keys))
		}
		resp, err := c.cli.Txn(ctx).If(cmps...).Then(clientv3.OpTxn(fresh, put, nil)).Else(storeguard.GetOp(c.keys)).Commit()
		if err != nil {
			return "", false, err
		}
		if resp.Succeeded {
			return Running, len(put) > 0 && resp.Responses[0].GetResponseTxn().Succeeded, nil
		} else if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return "", false, err
		}
	}
	return "", false, errors.New("the task kept changing; try again")
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
// loses none. Beside it, the queue's cancel cascades left behind are
// finished (cascadeScan).
func (k *childWakerOf) run(ctx context.Context) {
	done := make(chan struct{})
	go func() { defer close(done); k.c.cascadeScan(ctx, k.q, k.logger) }()
	defer func() { <-done }()
	for ctx.Err() == nil {
		err := k.runOnce(ctx)
		if err == nil || ctx.Err() != nil {
			continue
		}
		k.warn("queue: waking parents of finished children failed; retrying", "queue", k.q, "err", err)
		_ = lifecycle.Sleep(ctx, time.Duration(100+mrand.IntN(100))*time.Millisecond)
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
