// Package checkpoint stores agent state per thread as a chain of
// checkpoints, with LangGraph's checkpointer model, and makes lost updates
// impossible when two machines run the same thread at once.
//
// Two protections, both enforced in one etcd transaction:
//
//   - optimistic: Put succeeds only if its parent is still the thread's head
//     (compare-and-swap); on conflict the caller gets a *ConflictError with
//     the current head and retries its step;
//   - locked: the caller holds a lock on the thread (any lock backend) across
//     its read-modify-write, including the slow LLM call, and passes the lock
//     as the Put's fence. The store refuses a token lower than the highest it
//     has seen for the thread, so a writer whose lock expired during a long
//     call is rejected (lock.ErrFenced), not silently accepted. An etcd lock
//     is also checked as held, in the same transaction.
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

// MaxState is the largest state a checkpoint holds in etcd; put larger state
// in PostgreSQL or an object store.
const MaxState = 1 << 20

// Metadata is LangGraph's checkpoint metadata.
type Metadata struct {
	Source string            `json:"source"`
	Step   int               `json:"step"`
	Writer string            `json:"writer"`
	Extra  map[string]string `json:"extra,omitempty"`
}

// Checkpoint is one version of a thread's state.
type Checkpoint struct {
	ThreadID string `json:"thread_id"`
	// NS is LangGraph's checkpoint_ns; "" is the default namespace.
	NS string `json:"checkpoint_ns"`
	// ID is time-ordered: later checkpoints sort after earlier ones.
	ID        string    `json:"checkpoint_id"`
	ParentID  string    `json:"parent_checkpoint_id,omitempty"`
	Metadata  Metadata  `json:"metadata"`
	State     []byte    `json:"state"`
	Token     int64     `json:"token,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Write is a pending write of a task, saved before its checkpoint exists.
type Write struct {
	TaskID  string `json:"task_id"`
	Channel string `json:"channel"`
	Value   []byte `json:"value"`
}

// Fence is the right a fenced write is made under. Only its token is needed,
// so that a lock of any backend fences a write to any store (a Redis lock
// and PostgreSQL, say). When it is a lease.Fence (an etcd lock, a queue
// task's claim) the etcd store also commits only while it is held.
type Fence interface{ Token() int64 }

// ListOptions filters List.
type ListOptions struct {
	// Before lists only checkpoints older than this id.
	Before string
	// Limit is the most returned; 0 means 100.
	Limit int
	// Filter keeps checkpoints whose metadata has these values ("source",
	// "writer", "step", or an Extra key).
	Filter map[string]string
}

// Sentinel errors.
var (
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrConflict: the parent is no longer the thread's head
	// (*ConflictError).
	ErrConflict = errors.New("checkpoint: parent is not the head")
)

// ConflictError says which checkpoint is the head now.
type ConflictError struct {
	ThreadID, NS, Parent, Head string
}

// Error implements error.
func (e *ConflictError) Error() string {
	return fmt.Sprintf("checkpoint: thread %s: parent %q is not the head (the head is %q): another writer got there first; reload and redo the step", e.ThreadID, e.Parent, e.Head)
}

// Unwrap returns ErrConflict.
func (e *ConflictError) Unwrap() error { return ErrConflict }

// Store is a checkpoint store.
type Store interface {
	GetLatest(ctx context.Context, thread, ns string) (*Checkpoint, error)
	Get(ctx context.Context, thread, ns, id string) (*Checkpoint, error)
	List(ctx context.Context, thread, ns string, opts ListOptions) ([]Checkpoint, error)
	// Put writes cp as the thread's new head if cp.ParentID is the head
	// ("" for the first), and, with a fence, only if no higher token was
	// seen for the thread. It returns cp with its id and time filled in.
	Put(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error)
	PutWrites(ctx context.Context, thread, ns, checkpointID string, writes []Write, fence Fence) error
	// Writes returns the pending writes saved for a checkpoint.
	Writes(ctx context.Context, thread, ns, checkpointID string) ([]Write, error)
	DeleteThread(ctx context.Context, thread string) error
}

// NewID returns a time-ordered checkpoint id.
func NewID() string { return fmt.Sprintf("%016x%08x", time.Now().UnixNano(), rand.Uint32()) }

func check(thread, ns string) error {
	if err := keyspace.CheckName("thread_id", thread); err != nil {
		return err
	}
	if ns != "" {
		return keyspace.CheckName("checkpoint_ns", ns)
	}
	return nil
}

func checkState(cp Checkpoint) error {
	if len(cp.State) > MaxState {
		return &drover.InputError{Field: "state", Value: fmt.Sprintf("%d bytes", len(cp.State)),
			Rule: fmt.Sprintf("must be at most %d bytes in etcd: keep large state in PostgreSQL or an object store", MaxState)}
	}
	return nil
}
