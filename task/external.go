package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ErrBusy: a queue worker runs the task, and the claim was not to wait
// (ClaimOptions.Wait false) or its wait bound ended first (the error then
// matches the context's error too). Nothing is held.
var ErrBusy = errors.New("task: a queue worker is running it")

// ClaimOptions says how Claim takes a task.
type ClaimOptions struct {
	// Wait queues for the task (first come, first served on its lock)
	// while another holds it, and waits for a queue worker running it; ctx
	// bounds the wait. Without it a task held by another is refused at
	// once: a *lock.HeldError, or ErrBusy when a queue worker runs it.
	Wait bool
	// Held, if set, ends the wait for a queue worker when it ends (the
	// holder's lease or request is gone); nil means the lock's own context.
	Held context.Context
	// OnEvent, if set, is told EventWaiting while another holds the task.
	OnEvent func(Event)
}

// Claim takes task id for one holder through locker, whose lease the claim
// is bound to: the task's lock (fenced), and then no queue worker running
// it. It is the one claim path, shared by Runner and by the HTTP API's
// clients, so that a task has one holder however it is run. The returned
// lock is the fence of the task's checkpoint writes (Commit, Complete);
// release it when done. On error nothing is held.
func (s *Store) Claim(ctx context.Context, locker *lock.Etcd, id string, o ClaimOptions) (*lock.EtcdLock, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	emit := o.OnEvent
	if emit == nil {
		emit = func(Event) {}
	}
	name := keyspace.TaskLock(id)
	l, err := locker.TryAcquireFenced(ctx, name)
	if errors.Is(err, lock.ErrHeld) && o.Wait {
		emit(waitingEvent(id, err))
		l, err = locker.AcquireFenced(ctx, name)
	}
	if err != nil {
		return nil, fmt.Errorf("task %s: take the task: %w", id, err)
	}
	held := o.Held
	if held == nil {
		held = l.Context()
	}
	if err := s.awaitQueue(ctx, id, held, o.Wait, emit); err != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer rcancel()
		_ = l.Release(rctx) // on failure the lock frees itself when its lease ends
		return nil, err
	}
	return l, nil
}

// waitingEvent is EventWaiting for err, the refusal of a try-acquire: it
// names the holder's token when err says it.
func waitingEvent(id string, err error) Event {
	ev := Event{Type: EventWaiting, TaskID: id}
	var held *lock.HeldError
	if errors.As(err, &held) {
		ev.Token, ev.Err = held.Token, held.Error()
	}
	return ev
}

// awaitQueue returns once no queue worker runs task id, whose lock the
// caller now holds (an etcd lock's key keeps queue workers from claiming
// the task from now on; one that claimed it before is waited for). Without
// wait, a queue worker running it is refused at once with ErrBusy. held
// ends the wait when the caller's right ends.
func (s *Store) awaitQueue(ctx context.Context, id string, held context.Context, wait bool, emit func(Event)) error {
	wctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	busy := ""
	err := s.waitQueueClaim(wctx, id, held, func(q string) {
		if !wait {
			busy = q
			cancel(ErrBusy)
			return
		}
		emit(Event{Type: EventWaiting, TaskID: id, Err: "a worker of queue " + q + " is running it"})
	})
	switch {
	case err == nil:
		return nil
	case busy != "":
		return fmt.Errorf("task %s: %w: a worker of queue %s holds it", id, ErrBusy, busy)
	case ctx.Err() != nil:
		// The caller's wait bound ended with the queue worker still on it.
		return fmt.Errorf("task %s: %w: a queue worker still runs it when the wait ended: %w", id, ErrBusy, err)
	}
	return fmt.Errorf("task %s: wait for the queue worker running it: %w", id, err)
}

// Complete marks task id completed under fence f, which holds its claim:
// the checkpoint keeps its last step and, when result is not nil, takes
// result as its state; worker is recorded. No step record is written. A
// task already completed is returned as it is. It is fenced, compared and
// refused while the store is full like Commit.
func (s *Store) Complete(ctx context.Context, f lease.Fence, id string, result []byte, worker string) (Checkpoint, error) {
	cp, err := s.Load(ctx, id)
	if err != nil || cp.Completed {
		return cp, err
	}
	next := cp
	next.Completed, next.Worker, next.Token, next.At, next.SleepUntil = true, worker, f.Token(), time.Now().UTC(), time.Time{}
	if result != nil {
		next.State = result
	}
	if next.Steps < next.Step {
		next.Steps = next.Step
	}
	val, err := json.Marshal(next)
	if err != nil {
		return cp, fmt.Errorf("task: encode checkpoint: %w", err)
	}
	key := s.keys.TaskCheckpoint(id)
	resp, err := f.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", cp.modRev), storeguard.NotFull(s.keys)).
		Then(clientv3.OpPut(key, string(val))).
		Else(storeguard.GetOp(s.keys)).
		Commit()
	if err != nil {
		return cp, fmt.Errorf("task %s: complete: %w", id, err)
	}
	if !resp.Succeeded {
		if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return cp, fmt.Errorf("task %s: complete: %w", id, err)
		}
		return cp, fmt.Errorf("task %s: complete: %w", id, ErrConflict)
	}
	next.modRev = resp.Header.Revision
	return next, nil
}

// SetSteps records under fence f, which holds task id's claim, how many
// steps the task has, when a claim says so before any step was written
// (an HTTP client names the count at its claim and need not repeat it on
// every step write): prev, the checkpoint as loaded, keeps its step (0)
// and takes steps. A count already recorded is left as it is. It is
// fenced, compared and refused while the store is full like Commit.
func (s *Store) SetSteps(ctx context.Context, f lease.Fence, prev Checkpoint, steps int) (Checkpoint, error) {
	if steps <= 0 || prev.Steps != 0 || prev.Completed {
		return prev, nil
	}
	next := prev
	next.Steps = steps
	val, err := json.Marshal(next)
	if err != nil {
		return prev, fmt.Errorf("task: encode checkpoint: %w", err)
	}
	key := s.keys.TaskCheckpoint(prev.TaskID)
	resp, err := f.Txn(ctx).
		If(clientv3.Compare(clientv3.ModRevision(key), "=", prev.modRev), storeguard.NotFull(s.keys)).
		Then(clientv3.OpPut(key, string(val))).
		Else(storeguard.GetOp(s.keys)).
		Commit()
	if err != nil {
		return prev, fmt.Errorf("task %s: record its %d steps: %w", prev.TaskID, steps, err)
	}
	if !resp.Succeeded {
		if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return prev, fmt.Errorf("task %s: record its %d steps: %w", prev.TaskID, steps, err)
		}
		return prev, fmt.Errorf("task %s: record its %d steps: %w", prev.TaskID, steps, ErrConflict)
	}
	next.modRev = resp.Header.Revision
	return next, nil
}
