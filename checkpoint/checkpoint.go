// Package checkpoint stores agent state per thread as a chain of
// checkpoints, with LangGraph's checkpointer model, and makes lost updates
// impossible when two machines run the same thread at once.
//
// Two protections, both enforced in one etcd transaction:
//
//   - optimistic: Put succeeds only if its parent is still the thread's head
//     (compare-and-swap); on conflict the caller gets a *ConflictError with
//     the current head and retries its step (Append writes on any parent
//     instead, as LangGraph's savers do for forks and time travel, and keeps
//     the lock protection);
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
	"math"
	"math/rand/v2"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
)

// MaxState is the largest state a checkpoint holds in etcd; put larger state
// in PostgreSQL or an object store.
const MaxState = 1 << 20

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

// Write is a pending write of a task, saved for a checkpoint before its
// successor exists.
type Write struct {
	TaskID  string `json:"task_id"`
	Channel string `json:"channel"`
	Value   []byte `json:"value"`
	// Idx is the write's index, as LangGraph's putWrites gives it: its
	// position among the task's writes in the call, or a special channel's
	// negative index (WriteIdx). A write at Idx >= 0 is saved only if the
	// task has none at that index yet (a retried call changes nothing); a
	// write at a negative Idx replaces the task's earlier one.
	Idx int `json:"idx"`
}

// LangGraph's special channels and their fixed write indexes
// (WRITES_IDX_MAP): a task's write to one of them is kept once, the latest.
var specialIdx = map[string]int{"__error__": -1, "__scheduled__": -2, "__interrupt__": -3, "__resume__": -4}

// WriteIdx is the index LangGraph gives the write at position pos of a
// putWrites call to channel: the special channels' negative index, else
// pos.
func WriteIdx(channel string, pos int) int {
	if i, ok := specialIdx[channel]; ok {
		return i
	}
	return pos
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
	// Filter keeps checkpoints whose metadata has each of these top-level
	// keys with a deeply equal JSON value (objects by their keys, arrays in
	// order, numbers by value). A value is anything encoding/json encodes
	// (a json.RawMessage is taken as is).
	Filter map[string]any
	// AllNamespaces lists the checkpoints of every checkpoint namespace of
	// the thread, newest first by id (LangGraph's list without a
	// checkpoint_ns); the ns argument of List must then be "".
	AllNamespaces bool
	// AllThreads lists the checkpoints of every thread of the store's
	// namespace (LangGraph's list without a thread_id); the thread argument
	// of List must then be "". Threads come in the byte order of their id
	// followed by "/" (etcd's key order), each thread's checkpoints newest
	// first by id as a one-thread List gives them; Before (an id: only
	// older checkpoints, in every thread), Limit (in all) and Filter apply
	// across them. With AllNamespaces every namespace of each thread, else
	// namespace ns of each.
	AllThreads bool
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
	// Append writes cp as the thread's new head whatever the head is: its
	// ParentID is kept as given (any checkpoint, or none), as LangGraph's
	// savers do for a fork, update_state or a replay from an older
	// checkpoint. An existing checkpoint of the same id is replaced. With a
	// fence it is fenced like Put.
	Append(ctx context.Context, cp Checkpoint, fence Fence) (Checkpoint, error)
	// PutWrites saves a checkpoint's pending writes, each at its Write.Idx,
	// all or nothing, fenced like Put.
	PutWrites(ctx context.Context, thread, ns, checkpointID string, writes []Write, fence Fence) error
	// Writes returns the pending writes saved for a checkpoint.
	Writes(ctx context.Context, thread, ns, checkpointID string) ([]Write, error)
	DeleteThread(ctx context.Context, thread string) error
}

// NewID returns a time-ordered checkpoint id.
func NewID() string { return fmt.Sprintf("%016x%08x", time.Now().UnixNano(), rand.Uint32()) }

// MaxNSLen is the longest checkpoint namespace, in bytes.
const MaxNSLen = 1024

// NSRule describes the checkpoint namespaces the stores accept.
const NSRule = "must be valid UTF-8 of at most 1024 bytes without control characters (LangGraph's subgraph paths such as \"parent:1|child:2\" are fine)"

// CheckNS returns a *drover.InputError unless ns is a valid checkpoint
// namespace: any text ("" is the default namespace) of at most MaxNSLen
// bytes without control characters.
func CheckNS(ns string) error {
	ok := len(ns) <= MaxNSLen && utf8.ValidString(ns)
	for _, r := range ns {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			ok = false
		}
	}
	if !ok {
		return &drover.InputError{Field: "checkpoint_ns", Value: ns, Rule: NSRule}
	}
	return nil
}

func check(thread, ns string) error {
	if err := keyspace.CheckName("thread_id", thread); err != nil {
		return err
	}
	return CheckNS(ns)
}

// checkPut checks a checkpoint to put: its names, and that it is not its
// own parent.
// checkList checks List's arguments, defaults opts.Limit, and returns the
// encoded filter.
func checkList(thread, ns string, opts *ListOptions) (filter, error) {
	var err error
	switch {
	case !opts.AllThreads:
		err = check(thread, ns)
	case thread != "":
		err = &drover.InputError{Field: "thread_id", Value: thread, Rule: "must be empty when listing every thread"}
	default:
		err = CheckNS(ns)
	}
	if err != nil {
		return nil, err
	}
	if opts.AllNamespaces && ns != "" {
		return nil, &drover.InputError{Field: "checkpoint_ns", Value: ns, Rule: "must be empty when listing every namespace"}
	}
	if opts.Limit <= 0 {
		opts.Limit = 100
	}
	return newFilter(opts.Filter)
}

func checkPut(cp Checkpoint) error {
	if err := check(cp.ThreadID, cp.NS); err != nil {
		return err
	}
	for field, id := range map[string]string{"checkpoint_id": cp.ID, "parent_checkpoint_id": cp.ParentID} {
		if id == "" {
			continue
		}
		if err := keyspace.CheckName(field, id); err != nil {
			return err
		}
	}
	if cp.ID != "" && cp.ID == cp.ParentID {
		return &drover.InputError{Field: "parent_checkpoint_id", Value: cp.ParentID, Rule: "must not be the checkpoint's own id"}
	}
	return nil
}

// checkWrites checks pending writes: their task ids and indexes.
func checkWrites(writes []Write) error {
	for _, w := range writes {
		if err := keyspace.CheckName("task_id", w.TaskID); err != nil {
			return err
		}
		if w.Idx < math.MinInt32 || w.Idx > math.MaxInt32 {
			return &drover.InputError{Field: "writes", Value: strconv.Itoa(w.Idx), Rule: "a write's idx must fit in 32 bits"}
		}
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
