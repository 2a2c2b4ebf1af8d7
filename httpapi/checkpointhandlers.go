package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
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
// write): all of lock, session and token, or none.
func (s *Server) fence(ctx context.Context, f fenceFields) (checkpoint.Fence, error) {
	switch {
	case f.Lock == "" && f.Session == "" && f.Token == 0:
		return nil, nil
	case f.Lock == "":
		return nil, invalid("body.lock", nil, "a fenced write names the lock, its session and its token; give all three or none")
	case f.Session == "":
		return nil, invalid("body.session", nil, "a fenced write names the lock, its session and its token; give all three or none")
	case f.Token == 0:
		return nil, invalid("body.token", nil, "a fenced write names the lock, its session and its token; give all three or none")
	}
	h, err := s.heldLock(ctx, f.Lock, f.Token, f.Session, "body.session")
	if err != nil {
		return nil, err
	}
	return h, nil
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
	if len(b.State) > checkpoint.MaxState {
		return nil, invalid("body.state", fmt.Sprintf("%d bytes", len(b.State)),
			fmt.Sprintf("must be at most %d bytes in etcd: keep large state in PostgreSQL or an object store", checkpoint.MaxState))
	}
	f, err := s.fence(ctx, fenceFields{b.Lock, b.Session, b.Token})
	if err != nil {
		return nil, err
	}
	store, err := s.checkpointStore(ctx)
	if err != nil {
		return nil, err
	}
	if err := putParentWrites(ctx, store, in, f); err != nil {
		return nil, err
	}
	put := store.Put
	if b.Mode == putAppend {
		put = store.Append
	}
	cp, err := put(ctx, checkpoint.Checkpoint{ThreadID: in.Thread, NS: b.NS, ID: b.ID, ParentID: b.ParentID,
		Metadata: checkpoint.MetadataOf(b.Metadata), State: b.State}, f)
	if err != nil {
		return nil, checkpointProblem(err)
	}
	return &struct{ Body CheckpointPut }{CheckpointPut{ThreadID: cp.ThreadID, NS: cp.NS, ID: cp.ID, ParentID: cp.ParentID, Token: cp.Token, CreatedAt: cp.CreatedAt}}, nil
}

// putParentWrites saves the pending writes a put carries for its parent,
// each task's as the writes route does.
func putParentWrites(ctx context.Context, store *checkpoint.Etcd, in *putCheckpointInput, f checkpoint.Fence) error {
	b := in.Body
	if len(b.ParentWrites) == 0 {
		return nil
	}
	if b.ParentID == "" {
		return invalid("body.parent_writes", nil, "pending writes are the parent's: give parent_checkpoint_id")
	}
	// Every task's checked, then all saved in one call: a refusal writes nothing.
	var writes []checkpoint.Write
	for i, tw := range b.ParentWrites {
		if err := keyspace.CheckName(fmt.Sprintf("body.parent_writes[%d].task_id", i), tw.TaskID); err != nil {
			return problem(err, nil)
		}
		writes = append(writes, writesOf(tw.TaskID, tw.Writes)...)
	}
	if err := store.PutWrites(ctx, in.Thread, b.NS, b.ParentID, writes, f); err != nil {
		var ce *checkpoint.ConflictError
		if errors.As(err, &ce) {
			return checkpointProblem(err)
		}
		return problem(err, map[string]string{"writes": "body.parent_writes", "task_id": "body.parent_writes"})
	}
	return nil
}

// writesOf are a task's writes as the store takes them: each at its idx,
// by default its position.
func writesOf(task string, in []PendingWriteInput) []checkpoint.Write {
	writes := make([]checkpoint.Write, len(in))
	for i, w := range in {
		writes[i] = checkpoint.Write{TaskID: task, Channel: w.Channel, Value: w.Value, Idx: i}
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
	f, err := s.fence(ctx, fenceFields{b.Lock, b.Session, b.Token})
	if err != nil {
		return nil, err
	}
	store, err := s.checkpointStore(ctx)
	if err != nil {
		return nil, err
	}
	if err := store.PutWrites(ctx, in.Thread, b.NS, in.ID, writesOf(b.TaskID, b.Writes), f); err != nil {
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
