package task

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/storeguard"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits.
const (
	// MaxIDLen is the longest task id; ids follow the key segment rule of
	// keyspace.CheckName.
	MaxIDLen = 120
	// DefaultStateLimit is the default largest checkpoint state.
	DefaultStateLimit = 1 << 20
	// MaxStateLimit is the largest state limit a runner accepts: etcd
	// refuses requests over 1.5 MiB by default, and a checkpoint carries
	// the state base64-encoded (4/3 of its size) plus its records.
	MaxStateLimit = 1<<20 + 64<<10
)

// StepFunc runs one step. It gets the state the previous step returned (nil
// for the first step) and returns the new state. ctx is cancelled the moment
// the worker loses the task, so pass it into LLM and tool calls.
type StepFunc func(ctx context.Context, state []byte) ([]byte, error)

// Step is one named step of a task.
type Step struct {
	Name string
	Run  StepFunc
}

// Sentinel errors.
var (
	// ErrStateTooLarge: a step returned more state than the limit
	// (*StateTooLargeError). Nothing was written.
	ErrStateTooLarge = errors.New("task: checkpoint state too large")
	// ErrConflict: the checkpoint changed under a writer that held the
	// task's lock; only a write from outside drover can cause it.
	ErrConflict = errors.New("task: checkpoint changed concurrently")
	// ErrStepFailed: a step returned an error (*StepError).
	ErrStepFailed = errors.New("task: step failed")
	// ErrStepsChanged: a task's checkpoint was written by a run with a
	// different number of steps.
	ErrStepsChanged = errors.New("task: steps differ from the checkpoint")
)

// StateTooLargeError says which step returned too much state.
type StateTooLargeError struct {
	TaskID string
	Step   int
	Name   string
	Size   int
	Limit  int
}

// Error implements error.
func (e *StateTooLargeError) Error() string {
	return fmt.Sprintf("task %s step %d (%s) returned %d bytes of state, over the %d-byte limit; nothing was written: "+
		"keep large state in an object store or PostgreSQL and checkpoint its URI", e.TaskID, e.Step, e.Name, e.Size, e.Limit)
}

// Unwrap returns ErrStateTooLarge.
func (e *StateTooLargeError) Unwrap() error { return ErrStateTooLarge }

// StepError is a step's own error, with where it happened.
type StepError struct {
	TaskID string
	Step   int
	Name   string
	Err    error
}

// Error implements error.
func (e *StepError) Error() string {
	return fmt.Sprintf("task %s step %d (%s): %v", e.TaskID, e.Step, e.Name, e.Err)
}

// Unwrap returns ErrStepFailed and the step's error.
func (e *StepError) Unwrap() []error { return []error{ErrStepFailed, e.Err} }

// Checkpoint is a task's progress: the last completed step and its state.
type Checkpoint struct {
	TaskID string `json:"task_id"`
	// Step is the number (1-based) of the last completed step; 0 before
	// any.
	Step int `json:"step"`
	// StepName is the name of that step.
	StepName string `json:"step_name,omitempty"`
	// Steps is how many steps the task has.
	Steps int `json:"steps"`
	// Completed is true once the last step is checkpointed.
	Completed bool `json:"completed"`
	// State is what the last completed step returned.
	State []byte `json:"state,omitempty"`
	// SleepUntil, when set, is when the sleep the last completed step
	// ended with ends: the next step runs no earlier (see SleepRequest).
	SleepUntil time.Time `json:"sleep_until,omitzero"`
	// Wait, when set, is what the task waits for after the last completed
	// step: the next step runs once a signal named arrives or the wait
	// times out (see WaitRequest).
	Wait *Wait `json:"wait,omitempty"`
	// Spawn, when set, says the last completed step spawned children
	// (see Spawn): the next step runs once enough of them ended.
	Spawn *SpawnRecord `json:"spawn,omitempty"`
	// Worker and Token say who wrote the checkpoint, under which fencing
	// token.
	Worker string    `json:"worker,omitempty"`
	Token  int64     `json:"token,omitempty"`
	At     time.Time `json:"at"`

	modRev int64 // etcd ModRevision of the checkpoint key; 0 when absent
}

// StepRecord is the history entry of one completed step: which worker ran
// it, under which fencing token, and when.
type StepRecord struct {
	Step       int       `json:"step"`
	Name       string    `json:"name"`
	Worker     string    `json:"worker"`
	Token      int64     `json:"token"`
	StartedAt  time.Time `json:"started_at"`
	FinishedAt time.Time `json:"finished_at"`
}

// CheckID returns a drover.InputError unless id is a valid task id.
func CheckID(id string) error {
	if err := keyspace.CheckName("task id", id); err != nil {
		return err
	}
	if len(id) > MaxIDLen {
		return &drover.InputError{Field: "task id", Value: id, Rule: fmt.Sprintf("must be at most %d characters", MaxIDLen)}
	}
	return nil
}

// Store reads and writes task checkpoints and step records in etcd.
type Store struct {
	cli  *clientv3.Client
	keys keyspace.Space
}

// NewStore returns the store of namespace ns ("" means "drover").
func NewStore(cli *clientv3.Client, ns string) (*Store, error) {
	keys, err := keyspace.New(ns)
	if err != nil {
		return nil, err
	}
	return &Store{cli: cli, keys: keys}, nil
}

// Load returns task id's checkpoint; a task never checkpointed has Step 0.
func (s *Store) Load(ctx context.Context, id string) (Checkpoint, error) {
	return s.loadAfter(ctx, id, 0)
}

// loadAfter is Load for a caller whose claim of id was made at etcd
// revision after (0: unknown): a read of the etcd member's own state (no
// read index round) that has applied at least that revision sees every
// checkpoint an attempt before the claim wrote, since each was fenced by
// a claim that ended before this one began; an older one is read again
// linearizably.
func (s *Store) loadAfter(ctx context.Context, id string, after int64) (Checkpoint, error) {
	if err := CheckID(id); err != nil {
		return Checkpoint{}, err
	}
	var g *clientv3.GetResponse
	var err error
	if after > 0 {
		g, err = s.cli.Get(ctx, s.keys.TaskCheckpoint(id), clientv3.WithSerializable())
	}
	if after <= 0 || err != nil || g.Header.Revision < after {
		g, err = s.cli.Get(ctx, s.keys.TaskCheckpoint(id))
	}
	if err != nil {
		return Checkpoint{}, fmt.Errorf("task: load checkpoint of %s: %w", id, err)
	}
	cp := Checkpoint{TaskID: id}
	if len(g.Kvs) == 0 {
		return cp, nil
	}
	if err := json.Unmarshal(g.Kvs[0].Value, &cp); err != nil {
		return Checkpoint{}, fmt.Errorf("task: checkpoint of %s is unreadable: %w", id, err)
	}
	cp.modRev = g.Kvs[0].ModRevision
	return cp, nil
}

// History returns task id's step records in step order.
func (s *Store) History(ctx context.Context, id string) ([]StepRecord, error) {
	if err := CheckID(id); err != nil {
		return nil, err
	}
	g, err := s.cli.Get(ctx, s.keys.TaskSteps(id), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("task: history of %s: %w", id, err)
	}
	out := make([]StepRecord, 0, len(g.Kvs))
	for _, kv := range g.Kvs {
		var r StepRecord
		if err := json.Unmarshal(kv.Value, &r); err != nil {
			return nil, fmt.Errorf("task: step record %s is unreadable: %w", kv.Key, err)
		}
		out = append(out, r)
	}
	return out, nil
}

// Commit writes next as task id's checkpoint together with rec, in one
// transaction fenced by f, and only if the checkpoint is still prev (same
// modification revision) and step rec.Step has no record yet. The step
// record is written once per step, ever. On success next carries its new
// revision, ready to be the prev of the following commit.
//
// It is a data-plane write: while the namespace's store-full guard key
// exists (the server sets it when etcd's database nears its quota; see
// package storeguard) it writes nothing and returns an error matching
// drover.ErrStoreFull (a *drover.StoreFullError); the same commit
// succeeds once the key is gone.
func (s *Store) Commit(ctx context.Context, f lease.Fence, prev Checkpoint, next *Checkpoint, rec StepRecord) error {
	return s.commit(ctx, f, prev, next, rec, nil)
}

// commit is Commit with more writes made in the same transaction (a
// signal's consumption, a plan's last chunk) and more conditions (that a
// plan's chunks are still those written for this commit).
func (s *Store) commit(ctx context.Context, f lease.Fence, prev Checkpoint, next *Checkpoint, rec StepRecord, also []clientv3.Op, cmps ...clientv3.Cmp) (err error) {
	ctx, span := otelspan.StartCheckpoint(ctx, next.TaskID, rec.Step)
	defer func() { otelspan.End(span, err) }()
	cpKey, stepKey := s.keys.TaskCheckpoint(next.TaskID), s.keys.TaskStep(next.TaskID, rec.Step)
	cpVal, err := json.Marshal(next)
	if err != nil {
		return fmt.Errorf("task: encode checkpoint: %w", err)
	}
	recVal, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("task: encode step record: %w", err)
	}
	ops := append([]clientv3.Op{clientv3.OpPut(cpKey, string(cpVal)), clientv3.OpPut(stepKey, string(recVal))}, also...)
	if next.Spawn == nil { // the plan of a spawn write of the step that did not commit
		ops = append(ops, clientv3.OpDelete(s.keys.ChildPlan(next.TaskID, rec.Step), clientv3.WithPrefix()))
	}
	// The Else branch reads the guard key, so that a refusal says, in the
	// same transaction, whether the store was full or the checkpoint
	// changed.
	resp, err := f.Txn(ctx).
		If(append([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(cpKey), "=", prev.modRev),
			clientv3.Compare(clientv3.Version(stepKey), "=", 0),
			storeguard.NotFull(s.keys)}, cmps...)...).
		Then(ops...).
		Else(storeguard.GetOp(s.keys)).
		Commit()
	if err != nil {
		return fmt.Errorf("task %s: checkpoint step %d: %w", next.TaskID, rec.Step, err)
	}
	if !resp.Succeeded {
		if err := storeguard.FromRange(resp.Responses[0].GetResponseRange()); err != nil {
			return fmt.Errorf("task %s: checkpoint step %d: %w", next.TaskID, rec.Step, err)
		}
		return fmt.Errorf("task %s: checkpoint step %d: %w", next.TaskID, rec.Step, ErrConflict)
	}
	next.modRev = resp.Header.Revision
	return nil
}
