package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
)

// checkpointWhere maps the checkpoint package's input fields to request
// locations.
var checkpointWhere = map[string]string{
	"thread_id": "path.thread_id", "checkpoint_ns": "checkpoint_ns", "state": "body.state",
	"writes": "body.writes", "task_id": "body.task_id", "metadata": "body.metadata", "filter": "query.filter",
	"checkpoint_id": "body.checkpoint_id", "parent_checkpoint_id": "body.parent_checkpoint_id",
}

// checkpointStore is the etcd checkpoint store of the request's namespace.
func (s *Server) checkpointStore(ctx context.Context) (*checkpoint.Etcd, error) {
	st, err := checkpoint.NewEtcd(s.cli, s.nsOf(ctx))
	if err != nil {
		return nil, problem(err, nil)
	}
	return st, nil
}

// fencedStore is the fence of a checkpoint write (see fence) and the
// store it writes to.
func (s *Server) fencedStore(ctx context.Context, ff fenceFields) (*usedFence, *checkpoint.Etcd, error) {
	f, err := s.fence(ctx, ff)
	if err != nil {
		return nil, nil, err
	}
	store, err := s.checkpointStore(ctx)
	return f, store, err
}

// checkNames checks a thread, a checkpoint namespace (at nsLoc) and any
// checkpoint ids (location → id; "" ids are skipped).
func checkNames(thread, ns, nsLoc string, ids map[string]string) error {
	if err := keyspace.CheckName("thread_id", thread); err != nil {
		return problem(err, map[string]string{"thread_id": "path.thread_id"})
	}
	if err := checkpoint.CheckNS(ns); err != nil {
		return problem(err, map[string]string{"checkpoint_ns": nsLoc})
	}
	for loc, id := range ids {
		if id == "" {
			continue
		}
		if err := keyspace.CheckName(loc, id); err != nil {
			return problem(err, nil)
		}
	}
	return nil
}

// fence is the lock a write names, or nil (a plain compare-and-swap
// write): all of lock, session and token, or none. A lock verified held
// before is taken from the server's cache (see fenceCache); write it with
// fencedWrite, which verifies it again when etcd refuses it.
func (s *Server) fence(ctx context.Context, f fenceFields) (*usedFence, error) {
	switch {
	case f.Lock == "" && f.Session == "" && f.Token == 0:
		return &usedFence{}, nil
	case f.Lock == "":
		return nil, invalid("body.lock", nil, "a fenced write names the lock, its session and its token; give all three or none")
	case f.Session == "":
		return nil, invalid("body.session", nil, "a fenced write names the lock, its session and its token; give all three or none")
	case f.Token == 0:
		return nil, invalid("body.token", nil, "a fenced write names the lock, its session and its token; give all three or none")
	}
	k := newFenceKey(s.nsOf(ctx), f)
	if h, ok := s.fences.get(k); ok {
		return &usedFence{h: h, key: k, fields: f, cached: true}, nil
	}
	h, err := s.verifyFence(ctx, k, f)
	if err != nil {
		return nil, err
	}
	return &usedFence{h: h, key: k, fields: f}, nil
}

// verifyFence finds the lock f names held (heldLock) and caches it under k.
func (s *Server) verifyFence(ctx context.Context, k fenceKey, f fenceFields) (*heldLock, error) {
	h, err := s.heldLock(ctx, f.Lock, f.Token, f.Session, "body.session")
	if err != nil {
		return nil, err
	}
	s.fences.put(k, h)
	return h, nil
}

// usedFence is the fence of a write: h, nil for an unfenced write, and
// whether it came from the cache unverified.
type usedFence struct {
	h      *heldLock
	key    fenceKey
	fields fenceFields
	cached bool
}

// fence is the checkpoint store's fence: nil, not a nil *heldLock, for an
// unfenced write.
func (u *usedFence) fence() checkpoint.Fence {
	if u.h == nil {
		return nil
	}
	return u.h
}

// fencedWrite runs write under u. When etcd refused a write under a
// cached fence, the lock is forgotten and verified again: the answer is
// heldLock's when it is no longer held so (as without the cache), and
// otherwise write runs once more under the fresh verification (a refusal
// writes nothing, so it is safe to repeat).
func (s *Server) fencedWrite(ctx context.Context, u *usedFence, write func(checkpoint.Fence) error) error {
	err := write(u.fence())
	if !u.cached || !errors.Is(err, lease.ErrFenced) {
		return err
	}
	s.fences.forget(u.key)
	h, herr := s.verifyFence(ctx, u.key, u.fields)
	if herr != nil {
		return herr
	}
	return write(h)
}

// checkpointProblem is problem for the checkpoint package's errors.
func checkpointProblem(err error) error {
	var ce *checkpoint.ConflictError
	if errors.As(err, &ce) {
		return newProblem(http.StatusConflict, "conflict", ce.Error()+"; nothing was written")
	}
	return problem(err, checkpointWhere)
}

func (s *Server) putCheckpoint(ctx context.Context, in *putCheckpointInput) (*struct{ Body CheckpointPut }, error) {
	b := in.Body
	if err := checkNames(in.Thread, b.NS, "body.checkpoint_ns", map[string]string{"body.checkpoint_id": b.ID, "body.parent_checkpoint_id": b.ParentID}); err != nil {
		return nil, err
	}
	if b.ID != "" && b.ID == b.ParentID {
		return nil, invalid("body.parent_checkpoint_id", b.ParentID, "must not be the checkpoint's own id")
	}
	if len(b.State.Bytes()) > checkpoint.MaxState {
		return nil, invalid("body.state", fmt.Sprintf("%d bytes", len(b.State.Bytes())),
			fmt.Sprintf("must be at most %d bytes in etcd: keep large state in PostgreSQL or an object store", checkpoint.MaxState))
	}
	writes, err := parentWrites(in)
	if err != nil {
		return nil, err
	}
	f, store, err := s.fencedStore(ctx, fenceFields{b.Lock, b.Session, b.Token})
	if err != nil {
		return nil, err
	}
	put := store.PutWithWrites
	if b.Mode == putAppend {
		put = store.AppendWithWrites
	}
	var cp checkpoint.Checkpoint
	err = s.fencedWrite(ctx, f, func(f checkpoint.Fence) (err error) {
		cp, err = put(ctx, checkpoint.Checkpoint{ThreadID: in.Thread, NS: b.NS, ID: b.ID, ParentID: b.ParentID,
			Metadata: checkpoint.MetadataOf(b.Metadata), State: b.State.Bytes()}, writes, f)
		return err
	})
	if err != nil {
		var ce *checkpoint.ConflictError
		if errors.As(err, &ce) {
			return nil, checkpointProblem(err)
		}
		return nil, problem(err, putWhere)
	}
	return &struct{ Body CheckpointPut }{CheckpointPut{ThreadID: cp.ThreadID, NS: cp.NS, ID: cp.ID, ParentID: cp.ParentID, Token: cp.Token, CreatedAt: cp.CreatedAt}}, nil
}

func (s *Server) putCheckpointChain(ctx context.Context, in *putChainInput) (*struct{ Body CheckpointChainPut }, error) {
	b := in.Body
	links := make([]checkpoint.Link, len(b.Checkpoints))
	for i, l := range b.Checkpoints {
		at := fmt.Sprintf("body.checkpoints[%d].", i)
		if err := checkNames(in.Thread, b.NS, "body.checkpoint_ns", map[string]string{at + "checkpoint_id": l.ID, at + "parent_checkpoint_id": l.ParentID}); err != nil {
			return nil, err
		}
		if len(l.State.Bytes()) > checkpoint.MaxState {
			return nil, invalid(at+"state", fmt.Sprintf("%d bytes", len(l.State.Bytes())),
				fmt.Sprintf("must be at most %d bytes in etcd: keep large state in PostgreSQL or an object store", checkpoint.MaxState))
		}
		writes, err := taskWrites(at+"parent_writes", l.ParentWrites)
		if err != nil {
			return nil, err
		}
		links[i] = checkpoint.Link{Checkpoint: checkpoint.Checkpoint{ThreadID: in.Thread, NS: b.NS, ID: l.ID, ParentID: l.ParentID,
			Metadata: checkpoint.MetadataOf(l.Metadata), State: l.State.Bytes()}, ParentWrites: writes}
	}
	last, err := taskWrites("body.writes", b.Writes)
	if err != nil {
		return nil, err
	}
	f, store, err := s.fencedStore(ctx, fenceFields{b.Lock, b.Session, b.Token})
	if err != nil {
		return nil, err
	}
	var cps []checkpoint.Checkpoint
	err = s.fencedWrite(ctx, f, func(f checkpoint.Fence) (err error) {
		cps, err = store.PutChain(ctx, links, last, f, b.Mode != putAppend)
		return err
	})
	if err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) && strings.HasPrefix(ie.Field, "checkpoints") {
			return nil, problem(err, map[string]string{ie.Field: "body." + ie.Field})
		}
		var part *checkpoint.ChainError
		if errors.As(err, &part) {
			// Stored in part: say how far, whatever stopped the rest (a conflict says "nothing was written" otherwise).
			var p *Problem
			var ce *checkpoint.ConflictError
			if errors.As(part.Err, &ce) {
				p = newProblem(http.StatusConflict, "conflict", ce.Error())
			} else if !errors.As(problem(part.Err, putWhere), &p) {
				return nil, problem(part.Err, putWhere)
			}
			p.Detail = fmt.Sprintf("the first %d of %d checkpoints were stored, and the thread's head is %s; the rest were not: %s",
				part.Stored, len(links), links[part.Stored-1].Checkpoint.ID, p.Detail)
			return nil, p
		}
		return nil, checkpointProblem(err)
	}
	out := CheckpointChainPut{Checkpoints: make([]CheckpointPut, len(cps))}
	for i, cp := range cps {
		out.Checkpoints[i] = CheckpointPut{ThreadID: cp.ThreadID, NS: cp.NS, ID: cp.ID, ParentID: cp.ParentID, Token: cp.Token, CreatedAt: cp.CreatedAt}
	}
	return &struct{ Body CheckpointChainPut }{out}, nil
}

// taskWrites are tasks' pending writes as the store takes them, their task
// ids checked (at loc).
func taskWrites(loc string, in []TaskWritesInput) ([]checkpoint.Write, error) {
	var writes []checkpoint.Write
	for i, tw := range in {
		if err := keyspace.CheckName(fmt.Sprintf("%s[%d].task_id", loc, i), tw.TaskID); err != nil {
			return nil, problem(err, nil)
		}
		writes = append(writes, writesOf(tw.TaskID, tw.Writes)...)
	}
	return writes, nil
}

// putWhere maps the input fields of a put with its parent's writes to
// request locations: the writes' fields are parent_writes'.
var putWhere = func() map[string]string {
	m := map[string]string{"writes": "body.parent_writes", "task_id": "body.parent_writes"}
	for k, v := range checkpointWhere {
		if m[k] == "" {
			m[k] = v
		}
	}
	return m
}()

// parentWrites are the pending writes a put carries for its parent, each
// task's as the writes route takes them, checked: the put saves them with
// the checkpoint, in one transaction (see checkpoint.Etcd.PutWithWrites).
func parentWrites(in *putCheckpointInput) ([]checkpoint.Write, error) {
	b := in.Body
	if len(b.ParentWrites) == 0 {
		return nil, nil
	}
	if b.ParentID == "" {
		return nil, invalid("body.parent_writes", nil, "pending writes are the parent's: give parent_checkpoint_id")
	}
	return taskWrites("body.parent_writes", b.ParentWrites)
}

// writesOf are a task's writes as the store takes them: each at its idx,
// by default its position.
func writesOf(task string, in []PendingWriteInput) []checkpoint.Write {
	writes := make([]checkpoint.Write, len(in))
	for i, w := range in {
		writes[i] = checkpoint.Write{TaskID: task, Channel: w.Channel, Value: w.Value.Bytes(), Idx: i}
		if w.Idx != nil {
			writes[i].Idx = *w.Idx
		}
	}
	return writes
}

func (s *Server) putCheckpointWrites(ctx context.Context, in *putWritesInput) (*struct{}, error) {
	b := in.Body
	if err := checkNames(in.Thread, b.NS, "body.checkpoint_ns", map[string]string{"path.checkpoint_id": in.ID, "body.task_id": b.TaskID}); err != nil {
		return nil, err
	}
	f, store, err := s.fencedStore(ctx, fenceFields{b.Lock, b.Session, b.Token})
	if err != nil {
		return nil, err
	}
	writes := writesOf(b.TaskID, b.Writes)
	if err := s.fencedWrite(ctx, f, func(f checkpoint.Fence) error {
		return store.PutWrites(ctx, in.Thread, b.NS, in.ID, writes, f)
	}); err != nil {
		return nil, checkpointProblem(err)
	}
	return nil, nil
}

// tuple is cp with its pending writes.
func tuple(ctx context.Context, store *checkpoint.Etcd, cp *checkpoint.Checkpoint) (Checkpoint, error) {
	ws, err := store.Writes(ctx, cp.ThreadID, cp.NS, cp.ID)
	if err != nil {
		return Checkpoint{}, checkpointProblem(err)
	}
	out := Checkpoint{ThreadID: cp.ThreadID, NS: cp.NS, ID: cp.ID, ParentID: cp.ParentID, State: cp.State, Token: cp.Token, CreatedAt: cp.CreatedAt,
		Metadata: cp.Metadata.Fields(), Writes: make([]PendingWrite, len(ws))}
	for i, w := range ws {
		out.Writes[i] = PendingWrite{TaskID: w.TaskID, Channel: w.Channel, Value: append([]byte{}, w.Value...), Idx: w.Idx} // "" for empty, not null
	}
	return out, nil
}

func (s *Server) getHead(ctx context.Context, in *headInput) (*checkpointOutput, error) {
	if err := checkNames(in.Thread, in.NS, "query.checkpoint_ns", nil); err != nil {
		return nil, err
	}
	store, err := s.checkpointStore(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := store.GetLatest(ctx, in.Thread, in.NS)
	if err != nil {
		return nil, checkpointProblem(err)
	}
	out, err := tuple(ctx, store, cp)
	if err != nil {
		return nil, err
	}
	return &checkpointOutput{Body: out}, nil
}

// getOne reads checkpoint in.ID.
func (s *Server) getOne(ctx context.Context, in *getCheckpointInput) (*checkpoint.Etcd, *checkpoint.Checkpoint, error) {
	if err := checkNames(in.Thread, in.NS, "query.checkpoint_ns", map[string]string{"path.checkpoint_id": in.ID}); err != nil {
		return nil, nil, err
	}
	store, err := s.checkpointStore(ctx)
	if err != nil {
		return nil, nil, err
	}
	cp, err := store.Get(ctx, in.Thread, in.NS, in.ID)
	if err != nil {
		return nil, nil, checkpointProblem(err)
	}
	return store, cp, nil
}

func (s *Server) getCheckpoint(ctx context.Context, in *getCheckpointInput) (*checkpointOutput, error) {
	store, cp, err := s.getOne(ctx, in)
	if err != nil {
		return nil, err
	}
	out, err := tuple(ctx, store, cp)
	if err != nil {
		return nil, err
	}
	return &checkpointOutput{Body: out}, nil
}

type rawOutput struct {
	ContentType string `header:"Content-Type" doc:"application/octet-stream"`
	Body        []byte
}

func (s *Server) getCheckpointState(ctx context.Context, in *getCheckpointInput) (*rawOutput, error) {
	_, cp, err := s.getOne(ctx, in)
	if err != nil {
		return nil, err
	}
	return &rawOutput{ContentType: "application/octet-stream", Body: cp.State}, nil
}

// listFilter parses list filters: key=value, the value JSON or else a
// string.
func listFilter(in []string) (map[string]any, error) {
	filter := map[string]any{}
	for _, f := range in {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, invalid("query.filter", f, "must be key=value: a top-level metadata key and the JSON value it must have (a value that is not JSON is a string)")
		}
		if json.Valid([]byte(v)) {
			filter[k] = json.RawMessage(v)
		} else {
			filter[k] = v
		}
	}
	return filter, nil
}

func (s *Server) listCheckpoints(ctx context.Context, in *listCheckpointsInput) (*struct{ Body []Checkpoint }, error) {
	if err := checkNames(in.Thread, in.NS, "query.checkpoint_ns", map[string]string{"query.before": in.Before}); err != nil {
		return nil, err
	}
	return s.listTuples(ctx, in.Thread, in.NS, in.Filter, checkpoint.ListOptions{Before: in.Before, Limit: in.Limit, AllNamespaces: in.allNS})
}

// listAllCheckpoints lists every thread (LangGraph's list without a
// thread_id).
func (s *Server) listAllCheckpoints(ctx context.Context, in *listAllCheckpointsInput) (*struct{ Body []Checkpoint }, error) {
	if err := checkpoint.CheckNS(in.NS); err != nil {
		return nil, problem(err, map[string]string{"checkpoint_ns": "query.checkpoint_ns"})
	}
	if in.Before != "" {
		if err := keyspace.CheckName("query.before", in.Before); err != nil {
			return nil, problem(err, nil)
		}
	}
	return s.listTuples(ctx, "", in.NS, in.Filter, checkpoint.ListOptions{Before: in.Before, Limit: in.Limit, AllNamespaces: in.allNS, AllThreads: true})
}

// listTuples answers a list request: the checkpoints opts selects, each with its
// pending writes.
func (s *Server) listTuples(ctx context.Context, thread, ns string, filters []string, opts checkpoint.ListOptions) (*struct{ Body []Checkpoint }, error) {
	filter, err := listFilter(filters)
	if err != nil {
		return nil, err
	}
	opts.Filter = filter
	store, err := s.checkpointStore(ctx)
	if err != nil {
		return nil, err
	}
	cps, err := store.List(ctx, thread, ns, opts)
	if err != nil {
		return nil, checkpointProblem(err)
	}
	out := make([]Checkpoint, 0, len(cps))
	for i := range cps {
		t, err := tuple(ctx, store, &cps[i])
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return &struct{ Body []Checkpoint }{out}, nil
}

func (s *Server) deleteThread(ctx context.Context, in *threadPath) (*struct{}, error) {
	if err := checkNames(in.Thread, "", "", nil); err != nil {
		return nil, err
	}
	store, err := s.checkpointStore(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.DeleteThread(ctx, in.Thread); err != nil {
		return nil, checkpointProblem(err)
	}
	return nil, nil
}
