package httpapi

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// CheckpointMetadata is a checkpoint's metadata: a JSON object of any keys
// and values (LangGraph's source, step, parents, writes and the user's own),
// kept and returned unaltered; list filters match its top-level keys.
type CheckpointMetadata map[string]json.RawMessage

// PendingWrite is a pending write of a task, saved before its checkpoint's
// successor exists.
type PendingWrite struct {
	TaskID  string `json:"task_id" doc:"The task that made the write."`
	Channel string `json:"channel" doc:"The channel it writes to."`
	Value   []byte `json:"value" doc:"The value, base64."`
	Idx     int    `json:"idx" doc:"Its index among the task's writes (negative for LangGraph's special channels)."`
}

// Checkpoint is one checkpoint of a thread with its pending writes:
// LangGraph's checkpoint tuple.
type Checkpoint struct {
	ThreadID  string             `json:"thread_id" doc:"The thread."`
	NS        string             `json:"checkpoint_ns" doc:"LangGraph's checkpoint_ns; \"\" is the default namespace."`
	ID        string             `json:"checkpoint_id" doc:"The checkpoint's id; ids are time-ordered."`
	ParentID  string             `json:"parent_checkpoint_id,omitempty" doc:"The checkpoint it was written on; absent for a thread's first."`
	Metadata  CheckpointMetadata `json:"metadata" doc:"Its metadata."`
	State     []byte             `json:"state" doc:"The state (the serialized checkpoint), base64."`
	Token     int64              `json:"token,omitempty" doc:"The lock token it was written under, when fenced."`
	CreatedAt time.Time          `json:"created_at" doc:"When it was written."`
	Writes    []PendingWrite     `json:"pending_writes" doc:"The pending writes saved for it, by task then index."`
}

// CheckpointPut is the answer to a put: the new checkpoint's coordinates.
type CheckpointPut struct {
	ThreadID  string    `json:"thread_id" doc:"The thread."`
	NS        string    `json:"checkpoint_ns" doc:"The checkpoint namespace."`
	ID        string    `json:"checkpoint_id" doc:"The new checkpoint's id, now the thread's head: the parent of the next put."`
	ParentID  string    `json:"parent_checkpoint_id,omitempty" doc:"Its parent."`
	Token     int64     `json:"token,omitempty" doc:"The lock token it was written under, when fenced."`
	CreatedAt time.Time `json:"created_at" doc:"When it was written."`
}

// fenceFields name a lock held under a session; all three or none.
type fenceFields struct {
	Lock    string
	Session string
	Token   int64
}

// threadPath names a thread. Inputs repeat its fields rather than embed
// them: huma does not fill parameters of an embedded unexported struct.
type threadPath struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
}

// Put modes.
const (
	putCAS    = "cas"
	putAppend = "append"
)

type putCheckpointInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	Body   struct {
		NS       string             `json:"checkpoint_ns,omitempty" maxLength:"1024" doc:"The checkpoint namespace; default \"\". Any text of at most 1024 bytes without control characters, LangGraph's subgraph paths (\"parent:<task>|child:<task>\") included."`
		ID       string             `json:"checkpoint_id,omitempty" maxLength:"128" doc:"The new checkpoint's id (LangGraph's); generated, time-ordered, when absent. With mode append, an existing checkpoint of this id is replaced."`
		ParentID string             `json:"parent_checkpoint_id,omitempty" maxLength:"128" doc:"Its parent. Mode cas: the thread's head this checkpoint follows, 409 when the head is another; absent for a thread's first. Mode append: any checkpoint, or none."`
		Mode     string             `json:"mode,omitempty" enum:"cas,append" doc:"cas (the default): compare-and-swap, written only if parent_checkpoint_id is the head. append: LangGraph's put, written whatever the head is (a fork, update_state, a replay from an older checkpoint). Either way it becomes the head, and a lock fences it."`
		Metadata CheckpointMetadata `json:"metadata,omitempty" doc:"Its metadata: a JSON object of any keys and values, returned unaltered."`
		State    Base64Input        `json:"state" doc:"The state, base64: at most 1 MiB decoded."`
		Lock     string             `json:"lock,omitempty" maxLength:"128" doc:"Fence the write by this drover lock (POST /v1/locks/{name} with a session), held across the read-modify-write: a write after the lock was lost is a 409. Needs session and token."`
		Session  string             `json:"session,omitempty" doc:"With lock: the session the lock is held under."`
		Token    int64              `json:"token,omitempty" minimum:"1" doc:"With lock: its fencing token. The store also refuses a token lower than one already seen for the thread."`
		// ParentWrites are pending writes of the parent, saved with the
		// checkpoint: a step's writes and the next checkpoint in one request.
		ParentWrites []TaskWritesInput `json:"parent_writes,omitempty" maxItems:"1000" doc:"Pending writes of parent_checkpoint_id (needed with them), saved as by its writes route together with the checkpoint, in one etcd transaction: LangGraph's putWrites of a step's tasks and the put of the next checkpoint, in one request. A refusal writes neither. Only writes and state too large together for one etcd request are saved first, alone, and a refusal of the checkpoint (409) then keeps them."`
	}
}

// putChainInput is a chain of checkpoints, each the parent of the next.
type putChainInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	Body   struct {
		NS          string            `json:"checkpoint_ns,omitempty" maxLength:"1024" doc:"The checkpoint namespace of every checkpoint of the chain; default \"\"."`
		Mode        string            `json:"mode,omitempty" enum:"cas,append" doc:"cas (the default): written only if the first checkpoint's parent_checkpoint_id is the thread's head. append: whatever the head is. Either way the last checkpoint becomes the head."`
		Checkpoints []ChainLinkInput  `json:"checkpoints" minItems:"1" maxItems:"256" doc:"The checkpoints in order: each one's parent_checkpoint_id is the checkpoint_id of the one before it."`
		Writes      []TaskWritesInput `json:"writes,omitempty" maxItems:"1000" doc:"Pending writes of the last checkpoint, saved with the chain."`
		Lock        string            `json:"lock,omitempty" maxLength:"128" doc:"Fence the chain by this drover lock, as a put: needs session and token."`
		Session     string            `json:"session,omitempty" doc:"With lock: the session the lock is held under."`
		Token       int64             `json:"token,omitempty" minimum:"1" doc:"With lock: its fencing token."`
	}
}

// ChainLinkInput is one checkpoint of a chain, with its parent's pending writes.
type ChainLinkInput struct {
	ID           string             `json:"checkpoint_id" minLength:"1" maxLength:"128" doc:"The checkpoint's id (LangGraph's)."`
	ParentID     string             `json:"parent_checkpoint_id,omitempty" maxLength:"128" doc:"Its parent: for the first, the checkpoint the chain follows (absent for a thread's first); for the others, the checkpoint before it in the chain."`
	Metadata     CheckpointMetadata `json:"metadata,omitempty" doc:"Its metadata, returned unaltered."`
	State        Base64Input        `json:"state" doc:"The state, base64: at most 1 MiB decoded."`
	ParentWrites []TaskWritesInput  `json:"parent_writes,omitempty" maxItems:"1000" doc:"Pending writes of its parent, saved with it."`
}

// CheckpointChainPut is a stored chain: its checkpoints as a put answers each.
type CheckpointChainPut struct {
	Checkpoints []CheckpointPut `json:"checkpoints" doc:"The checkpoints stored, in order; the last is the thread's head."`
}

// TaskWritesInput are a task's pending writes, sent with a put.
type TaskWritesInput struct {
	TaskID string              `json:"task_id" minLength:"1" maxLength:"128" doc:"The task that made the writes."`
	Writes []PendingWriteInput `json:"writes" maxItems:"10000" doc:"The writes, each at its idx, as the writes route takes them."`
}

// PendingWriteInput is one write of a put writes request.
type PendingWriteInput struct {
	Channel string      `json:"channel" minLength:"1" maxLength:"256" doc:"The channel."`
	Value   Base64Input `json:"value,omitempty" doc:"The value, base64; absent for an empty value."`
	Idx     *int        `json:"idx,omitempty" minimum:"-2147483648" maximum:"2147483647" doc:"Its index among the task's writes, as LangGraph's putWrites gives it (WRITES_IDX_MAP: __error__ -1, __scheduled__ -2, __interrupt__ -3, __resume__ -4, else the position); default: its position in this call. At an index >= 0 it is saved only if the task has no write there yet; at a negative index it replaces the task's earlier one."`
}

// Base64Input is bytes a request sends as a JSON string of standard base64
// with padding (RFC 4648 section 4, Go's base64.StdEncoding): a checkpoint's
// state, a pending write's value, a step's state. A []byte field takes the
// same strings, but huma gives it the schema contentEncoding base64 and
// then matches each such string against a regular expression before
// encoding/json decodes it again: at about 69 MB/s, 20 ms for a 1 MiB
// state whose decoding takes 1.7 ms, and 8.6 % of all CPU in a stream of
// 2 KiB checkpoint puts. Its schema says format byte instead, which huma
// does not check: it is decoded once, as the body is parsed, and Resolve
// refuses what did not decode at the field's location (without its value).
// It takes what the []byte field took behind huma's check: at least one
// character, no line breaks; JSON null is no bytes.
type Base64Input struct {
	b   []byte
	bad bool // a string that is not base64
}

// base64Rule is the rule a Base64Input that did not decode broke.
const base64Rule = "expected standard base64 with padding (RFC 4648 section 4: A-Z, a-z, 0-9, '+' and '/', " +
	"'=' to a multiple of 4 characters, no spaces or line breaks) of at least one byte, as Go's base64.StdEncoding " +
	"and Python's base64.b64encode write it"

// Bytes returns the decoded bytes.
func (v Base64Input) Bytes() []byte { return v.b }

// Schema implements huma.SchemaProvider: a string of format byte.
func (*Base64Input) Schema(huma.Registry) *huma.Schema {
	return &huma.Schema{Type: huma.TypeString, Format: "byte"}
}

// UnmarshalJSON decodes a JSON string of base64; one that is not is
// remembered for Resolve, which names the field. Another JSON type is
// left alone: the schema has refused it already.
func (v *Base64Input) UnmarshalJSON(data []byte) error {
	*v = Base64Input{}
	if string(data) == "null" {
		return nil
	}
	if len(data) < 2 || data[0] != '"' {
		// Another JSON type: the schema refused it already, at the
		// field's location. No error here, which would stop the decoding
		// and leave the body's later fields unchecked.
		return nil
	}
	src := data[1 : len(data)-1]
	if bytes.IndexByte(src, '\\') >= 0 {
		// Escapes are rare: unquote, and refuse the line breaks that
		// base64.StdEncoding would skip (no raw one passes the JSON scan).
		var s string
		if err := json.Unmarshal(data, &s); err != nil {
			return err
		}
		if strings.ContainsAny(s, "\r\n") {
			v.bad = true
			return nil
		}
		src = []byte(s)
	}
	if len(src) == 0 {
		v.bad = true
		return nil
	}
	b := make([]byte, base64.StdEncoding.DecodedLen(len(src)))
	n, err := base64.StdEncoding.Decode(b, src)
	if err != nil {
		v.bad = true
		return nil
	}
	v.b = b[:n]
	return nil
}

// MarshalJSON writes the bytes as base64, as a []byte field would.
func (v Base64Input) MarshalJSON() ([]byte, error) { return json.Marshal(v.b) }

// Resolve implements huma.ResolverWithPath: a string that was not base64
// is refused at its location.
func (v *Base64Input) Resolve(_ huma.Context, prefix *huma.PathBuffer) []error {
	if !v.bad {
		return nil
	}
	return []error{&huma.ErrorDetail{Location: prefix.String(), Message: base64Rule}}
}

type putWritesInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	ID     string `path:"checkpoint_id" minLength:"1" maxLength:"128" doc:"The checkpoint's id."`
	Body   struct {
		NS      string              `json:"checkpoint_ns,omitempty" maxLength:"1024" doc:"The checkpoint namespace; default \"\"."`
		TaskID  string              `json:"task_id" minLength:"1" maxLength:"128" doc:"The task that made the writes."`
		Writes  []PendingWriteInput `json:"writes" maxItems:"10000" doc:"The writes, each at its idx: insert-if-absent at an index >= 0 (a retried call changes nothing), replace at a negative one."`
		Lock    string              `json:"lock,omitempty" maxLength:"128" doc:"Fence the write by this drover lock (POST /v1/locks/{name} with a session), held across the read-modify-write: a write after the lock was lost is a 409. Needs session and token."`
		Session string              `json:"session,omitempty" doc:"With lock: the session the lock is held under."`
		Token   int64               `json:"token,omitempty" minimum:"1" doc:"With lock: its fencing token. The store also refuses a token lower than one already seen for the thread."`
	}
}

type getCheckpointInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	ID     string `path:"checkpoint_id" minLength:"1" maxLength:"128" doc:"The checkpoint's id."`
	NS     string `query:"checkpoint_ns" maxLength:"1024" doc:"The checkpoint namespace; default \"\"."`
}

type headInput struct {
	Thread string `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	NS     string `query:"checkpoint_ns" maxLength:"1024" doc:"The checkpoint namespace; default \"\"."`
}

type listCheckpointsInput struct {
	Thread string   `path:"thread_id" minLength:"1" maxLength:"128" doc:"The thread: letters, digits, '.', '_', '-' and ':'."`
	NS     string   `query:"checkpoint_ns" maxLength:"1024" doc:"The checkpoint namespace (checkpoint_ns= is the default one, \"\"). Absent: every namespace of the thread, newest first by id (LangGraph's list without checkpoint_ns)."`
	Before string   `query:"before" maxLength:"128" doc:"Only checkpoints older than this id."`
	Limit  int      `query:"limit" minimum:"0" maximum:"1000" doc:"The most returned; default 100."`
	Filter []string `query:"filter,explode" doc:"key=value: only checkpoints whose metadata has top-level key with a deeply equal value. The value is JSON (step=0, parents={\"\":\"1ef\"}, source=\"loop\"); one that is not valid JSON is taken as a string (source=loop). Repeat for more keys."`
	// allNS is set when the query has no checkpoint_ns (see Resolve).
	allNS bool
}

// Resolve tells an absent checkpoint_ns (every namespace) from an empty
// one (the default namespace).
func (in *listCheckpointsInput) Resolve(ctx huma.Context) []error {
	u := ctx.URL()
	in.allNS = !u.Query().Has("checkpoint_ns")
	return nil
}

// listAllCheckpointsInput lists the checkpoints of every thread.
type listAllCheckpointsInput struct {
	NS     string   `query:"checkpoint_ns" maxLength:"1024" doc:"The checkpoint namespace (checkpoint_ns= is the default one, \"\"). Absent: every namespace of each thread."`
	Before string   `query:"before" maxLength:"128" doc:"Only checkpoints whose id is below this one, in every thread (LangGraph's before: a config's checkpoint_id)."`
	Limit  int      `query:"limit" minimum:"0" maximum:"1000" doc:"The most returned, across threads; default 100."`
	Filter []string `query:"filter,explode" doc:"key=value: only checkpoints whose metadata has top-level key with a deeply equal value. The value is JSON (step=0, parents={\"\":\"1ef\"}, source=\"loop\"); one that is not valid JSON is taken as a string (source=loop). Repeat for more keys."`
	// allNS is set when the query has no checkpoint_ns (see Resolve).
	allNS bool
}

// Resolve tells an absent checkpoint_ns (every namespace) from an empty
// one (the default namespace).
func (in *listAllCheckpointsInput) Resolve(ctx huma.Context) []error {
	u := ctx.URL()
	in.allNS = !u.Query().Has("checkpoint_ns")
	return nil
}

type checkpointOutput struct{ Body Checkpoint }

// maxCheckpointBody is the largest checkpoint put or writes request: the
// store's state bound, base64, and room for the rest.
const maxCheckpointBody = checkpoint.MaxState*4/3 + 64<<10

// maxChainBody bounds a chain's body: the states of a few checkpoints of
// the largest size (more go in more requests).
const maxChainBody = 4 * maxCheckpointBody

// checkpointRoutes registers the checkpoint routes: LangGraph's saver
// (put, putWrites, getTuple, list, deleteThread) per thread, on etcd, with
// compare-and-swap or lock-fenced writes.
func (s *Server) checkpointRoutes() {
	tags := []string{"checkpoints"}
	huma.Register(s.api, huma.Operation{
		OperationID: "put-checkpoint", Method: http.MethodPost, Path: "/v1/threads/{thread_id}/checkpoints", Tags: tags,
		Summary: "Put a checkpoint as the thread's new head",
		Description: "Mode cas (the default), compare-and-swap: it is written only if parent_checkpoint_id is the thread's head (absent: the thread has none), " +
			"else 409 naming the head, and nothing is written. Mode append (LangGraph's put): written on any parent, or none, for forks and time travel. " +
			"Either way it becomes the head. With lock, session and token it is also fenced by that lock: 409 once lost. " +
			"parent_writes saves pending writes of the parent with it, both or neither (404 when the parent does not exist): a step's writes and the next checkpoint in one request. " +
			"507 while etcd is past its high-water mark.",
		DefaultStatus: http.StatusCreated,
		MaxBodyBytes:  maxCheckpointBody,
		// A large body may take as long to arrive as the route's bound.
		BodyReadTimeout: bulkAllowance,
		Errors:          []int{http.StatusConflict, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.putCheckpoint)
	huma.Register(s.api, huma.Operation{
		OperationID: "put-checkpoint-writes", Method: http.MethodPost, Path: "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}/writes", Tags: tags,
		Summary: "Save a task's pending writes for a checkpoint (LangGraph's putWrites), all or nothing",
		Description: "Each write at its idx: insert-if-absent at an index >= 0, replace at a negative one (LangGraph's special channels). " +
			"404 when the checkpoint does not exist. Fenced like a put when lock, session and token are given.",
		DefaultStatus: http.StatusNoContent,
		MaxBodyBytes:  maxCheckpointBody,
		// A large body may take as long to arrive as the route's bound.
		BodyReadTimeout: bulkAllowance,
		Errors:          []int{http.StatusConflict, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.putCheckpointWrites)
	huma.Register(s.api, huma.Operation{
		OperationID: "put-checkpoint-chain", Method: http.MethodPost, Path: "/v1/threads/{thread_id}/checkpoint-chains", Tags: tags,
		Summary: "Put checkpoints that follow one another, with their pending writes, in one request",
		Description: "What a run that does not wait for its checkpoints has queued while its last request was under way: each checkpoint the parent of the next, " +
			"each with its parent's pending writes, and writes of the last. The last becomes the thread's head. Mode and fence as a put; mode cas compares the first's parent with the head. " +
			"A chain of at most 32 checkpoints and about 1.4 MiB of states and writes is stored in one etcd transaction, whole or not at all; " +
			"a larger one checkpoint by checkpoint, and a refusal part way says how many were stored (the thread's head is then the last of them). " +
			"Mode append is safe to repeat after a lost answer. 507 while etcd is past its high-water mark.",
		DefaultStatus:   http.StatusCreated,
		MaxBodyBytes:    maxChainBody,
		BodyReadTimeout: bulkAllowance,
		Errors:          []int{http.StatusConflict, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.putCheckpointChain)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-checkpoint-head", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/head", Tags: tags,
		Summary: "The thread's latest checkpoint with its pending writes (LangGraph's getTuple without an id); 404 when it has none",
		Errors:  []int{http.StatusNotFound},
	}, s.getHead)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-checkpoint", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}", Tags: tags,
		Summary: "A checkpoint with its pending writes (LangGraph's getTuple with an id)",
		Errors:  []int{http.StatusNotFound},
	}, s.getCheckpoint)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-checkpoint-state", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/checkpoints/{checkpoint_id}/state", Tags: tags,
		Summary: "A checkpoint's state as raw bytes (application/octet-stream)",
		Errors:  []int{http.StatusNotFound},
	}, s.getCheckpointState)
	huma.Register(s.api, huma.Operation{
		OperationID: "list-checkpoints", Method: http.MethodGet, Path: "/v1/threads/{thread_id}/checkpoints", Tags: tags,
		Summary: "The thread's checkpoints, newest first, with their pending writes (LangGraph's list); without checkpoint_ns, those of every namespace",
	}, s.listCheckpoints)
	huma.Register(s.api, huma.Operation{
		OperationID: "list-all-checkpoints", Method: http.MethodGet, Path: "/v1/checkpoints", Tags: tags,
		Summary: "The checkpoints of every thread, with their pending writes (LangGraph's list without a thread_id)",
		Description: "Threads in the byte order of their id followed by \"/\" (the etcd key order), each thread's checkpoints newest first by id " +
			"(across namespaces when checkpoint_ns is absent), as the thread's own list gives them. " +
			"before compares checkpoint ids in every thread; limit counts across threads; filter as on the thread's list. " +
			"The cost grows with the threads read before the limit is reached: every thread when before or filter keeps few.",
	}, s.listAllCheckpoints)
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-thread", Method: http.MethodDelete, Path: "/v1/threads/{thread_id}", Tags: tags,
		Summary:       "Delete every checkpoint, write and fence of a thread, in every checkpoint namespace",
		DefaultStatus: http.StatusNoContent,
	}, s.deleteThread)
}

// heldLock is an etcd lock that a client holds under its session across
// requests (a lock of POST /v1/locks/{name}, an agent task's claim), proved
// by the session and the fencing token. It is the fence of the writes the
// client makes under it: each commits only while the lock's key still
// exists with the token as its create revision. A key bound to a session
// is deleted by etcd when the session ends, so a write after that, or after
// a release, is refused in the same transaction that would apply it.
type heldLock struct {
	cli    *clientv3.Client
	name   string
	key    string
	token  int64
	holder lock.Holder
}

var _ lease.Fence = (*heldLock)(nil)

// Token is the lock's fencing token.
func (h *heldLock) Token() int64 { return h.token }

// Txn starts a transaction that commits only while the lock is held with
// the token; otherwise Commit returns an error matching lease.ErrFenced.
func (h *heldLock) Txn(ctx context.Context) clientv3.Txn {
	return lease.NewFencedTxn(ctx, h.cli, lease.Spec{
		Name:  fmt.Sprintf("lock %q", h.name),
		Token: h.token,
		Cmp:   clientv3.Compare(clientv3.CreateRevision(h.key), "=", h.token),
	})
}

// Context is never cancelled: the server does not watch a client's lock
// between requests; Txn's compare is what fences.
func (h *heldLock) Context() context.Context { return context.Background() }

// Err is nil: a loss is found by Txn's compare, not known beforehand.
func (h *heldLock) Err() error { return nil }

// heldLock finds lock name held with token under session (the hex id, at
// location for errors): a 409 (fenced) unless its holder's key has that
// create revision and is bound to that session.
func (s *Server) heldLock(ctx context.Context, name string, token int64, session, location string) (*heldLock, error) {
	id, err := s.sessionLease(ctx, location, session)
	if err != nil {
		return nil, err
	}
	if err := lock.CheckName(name); err != nil {
		return nil, problem(err, map[string]string{"name": "body.lock"})
	}
	g, err := s.cli.Get(ctx, s.keys(ctx).Lock(name), clientv3.WithFirstCreate()...)
	if err != nil {
		return nil, problem(fmt.Errorf("read lock %q: %w", name, err), nil)
	}
	if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != token || g.Kvs[0].Lease != int64(id) {
		now := "it is free"
		if len(g.Kvs) > 0 {
			now = fmt.Sprintf("it is held with token %d", g.Kvs[0].CreateRevision)
		}
		return nil, problem(fmt.Errorf("%w: lock %q is not held with token %d under session %s (%s)", lease.ErrFenced, name, token, redact(session), now), nil)
	}
	kv := g.Kvs[0]
	h := &heldLock{cli: s.cli, name: name, key: string(kv.Key), token: token}
	_ = json.Unmarshal(kv.Value, &h.holder)
	return h, nil
}

// fenceKey names a fence as a request gives it, in a namespace: the lock,
// the token and a hash of the whole session id, its secret included (the
// cache keeps no secret, as the session cache keeps none).
type fenceKey struct {
	ns, lock string
	token    int64
	session  [sha256.Size]byte
}

func newFenceKey(ns string, f fenceFields) fenceKey {
	return fenceKey{ns: ns, lock: f.Lock, token: f.Token, session: sha256.Sum256([]byte(f.Session))}
}

// fenceCache remembers the locks verified held (heldLock) for fenced
// checkpoint writes, so that a run's later writes under the same lock skip
// the session's check and the read of the lock. It forgets everything past
// maxCachedFences.
//
// No library gives this: etcd's client caches nothing, and what is cached
// is drover's own proof that a session holds a lock. It is sound because it
// never decides a write: every write under a heldLock commits only while
// the lock's key still has the token as its create revision (heldLock.Txn),
// and a key's create revision is unique to that key's life, whose lease is
// the one its contender name was made with (the session's, checked when
// the entry was made). A lock released, lost with its session or taken by
// another holder fails that compare; the entry is then forgotten and the
// lock verified again (Server.fencedWrite), so the answer is the one
// heldLock gives. The key holds the hash of the session with its secret,
// so a wrong secret never finds the entry of the right one.
type fenceCache struct {
	mu sync.Mutex
	m  map[fenceKey]*heldLock
}

const maxCachedFences = 10_000

func (c *fenceCache) get(k fenceKey) (*heldLock, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h, ok := c.m[k]
	return h, ok
}

func (c *fenceCache) put(k fenceKey, h *heldLock) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxCachedFences {
		c.m = map[fenceKey]*heldLock{}
	}
	c.m[k] = h
}

func (c *fenceCache) forget(k fenceKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, k)
}
