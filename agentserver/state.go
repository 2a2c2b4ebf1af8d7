package agentserver

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// checkpointIDOf is the checkpoint_id of a state's checkpoint.
func checkpointIDOf(st ThreadState) string {
	m, _ := st.Checkpoint.(map[string]any)
	id, _ := m["checkpoint_id"].(string)
	return id
}

// withSubgraphs is st as LangGraph answers it with subgraphs or without:
// the runtime reports, for each task that runs a subgraph, both the
// subgraph's state and its checkpoint reference ({thread_id,
// checkpoint_ns}). Without subgraphs a task keeps its reference and no
// state; with them, a task with a state has no reference, at every depth.
// st's own maps are not changed.
func withSubgraphs(st ThreadState, subgraphs bool) ThreadState {
	if len(st.Tasks) == 0 {
		return st
	}
	tasks := make([]any, len(st.Tasks))
	for i, t := range st.Tasks {
		tasks[i] = taskWithSubgraphs(t, subgraphs, 0)
	}
	st.Tasks = tasks
	return st
}

// maxSubgraphDepth bounds the nesting of subgraph states walked.
const maxSubgraphDepth = 64

func taskWithSubgraphs(t any, subgraphs bool, depth int) any {
	m, ok := t.(map[string]any)
	if !ok {
		return t
	}
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[k] = v
	}
	nested, _ := m["state"].(map[string]any)
	switch {
	case !subgraphs:
		if _, has := m["state"]; has {
			out["state"] = nil
		}
	case nested != nil:
		out["checkpoint"] = nil
		if ts, ok := nested["tasks"].([]any); ok && depth < maxSubgraphDepth {
			n := make(map[string]any, len(nested))
			for k, v := range nested {
				n[k] = v
			}
			inner := make([]any, len(ts))
			for i, x := range ts {
				inner[i] = taskWithSubgraphs(x, true, depth+1)
			}
			n["tasks"] = inner
			out["state"] = n
		}
	}
	return out
}

// stateAt is the thread's state at checkpoint id (its latest for "").
func (s *server) stateAt(ctx context.Context, thread, id string) (ThreadState, error) {
	if id == "" {
		rec, err := s.threadState(ctx, thread)
		return rec.State, err
	}
	h, err := s.threadHistory(ctx, thread, 0)
	if err != nil {
		return ThreadState{}, err
	}
	for _, st := range h.states {
		if checkpointIDOf(st) == id {
			return st, nil
		}
	}
	return ThreadState{}, huma.NewError(http.StatusNotFound, "Checkpoint "+id+" of thread "+thread+" not found")
}

type historyBody struct {
	Limit      int            `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"10"`
	Before     any            `json:"before,omitempty" doc:"Only states before this checkpoint ({checkpoint_id})."`
	Metadata   map[string]any `json:"metadata,omitempty" doc:"Only states whose metadata contains this."`
	Checkpoint any            `json:"checkpoint,omitempty" doc:"Only states of this checkpoint namespace."`
}

// history is thread's states, newest first, as b filters them. Without a
// filter it reads only as many states as it answers.
func (s *server) history(ctx context.Context, thread string, b historyBody) ([]ThreadState, error) {
	before := ""
	if m, ok := b.Before.(map[string]any); ok {
		before, _ = m["checkpoint_id"].(string)
	} else if sid, ok := b.Before.(string); ok {
		before = sid
	}
	limit := int64(0)
	if before == "" && b.Metadata == nil {
		limit = int64(max(b.Limit, 1))
	}
	h, err := s.threadHistory(ctx, thread, limit)
	if err != nil {
		return nil, err
	}
	out := []ThreadState{}
	skipping := before != ""
	for _, st := range h.states {
		if skipping {
			skipping = checkpointIDOf(st) != before
			continue
		}
		if b.Metadata != nil && !contains(map[string]any(st.Metadata), map[string]any(b.Metadata)) {
			continue
		}
		if len(out) == max(b.Limit, 1) {
			break
		}
		out = append(out, withSubgraphs(st, false))
	}
	return out, nil
}

func (s *server) stateRoutes(api huma.API) {
	tags := []string{tagThreads}
	huma.Register(api, huma.Operation{
		OperationID: "lg-thread-state", Method: http.MethodGet, Path: "/threads/{thread_id}/state", Tags: tags,
		Summary:     "A thread's state (LangGraph)",
		Description: "As the runtime of the thread's last run read it from the checkpoint store when the run ended.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID   string `path:"thread_id" doc:"The thread's id, a UUID."`
		Subgraphs  bool   `query:"subgraphs" doc:"Each subgraph task's state in place of its checkpoint reference."`
		Checkpoint string `query:"checkpoint_id" doc:"The state at this checkpoint."`
	}) (*struct{ Body ThreadState }, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		st, err := s.stateAt(ctx, id, in.Checkpoint)
		return &struct{ Body ThreadState }{Body: withSubgraphs(st, in.Subgraphs)}, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-thread-state-at", Method: http.MethodGet, Path: "/threads/{thread_id}/state/{checkpoint_id}", Tags: tags,
		Summary: "A thread's state at a checkpoint (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID   string `path:"thread_id" doc:"The thread's id, a UUID."`
		Checkpoint string `path:"checkpoint_id"`
		Subgraphs  bool   `query:"subgraphs" doc:"Each subgraph task's state in place of its checkpoint reference."`
	}) (*struct{ Body ThreadState }, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		st, err := s.stateAt(ctx, id, in.Checkpoint)
		return &struct{ Body ThreadState }{Body: withSubgraphs(st, in.Subgraphs)}, err
	})
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-thread-state-at-checkpoint", Method: http.MethodPost, Path: "/threads/{thread_id}/state/checkpoint", Tags: tags,
		Summary: "A thread's state at a checkpoint given in the body (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}), func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Body     struct {
			Checkpoint map[string]any `json:"checkpoint"`
			Subgraphs  bool           `json:"subgraphs,omitempty"`
		}
	}) (*struct{ Body ThreadState }, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		cid, _ := in.Body.Checkpoint["checkpoint_id"].(string)
		st, err := s.stateAt(ctx, id, cid)
		return &struct{ Body ThreadState }{Body: withSubgraphs(st, in.Body.Subgraphs)}, err
	})
	s.historyRoutes(api, tags)
	s.updateStateRoute(api)
}

func (s *server) historyRoutes(api huma.API, tags []string) {
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-thread-history", Method: http.MethodPost, Path: "/threads/{thread_id}/history", Tags: tags,
		Summary: "A thread's states, newest first (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}), func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Body     historyBody
	}) (*struct{ Body []ThreadState }, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		h, err := s.history(ctx, id, in.Body)
		return &struct{ Body []ThreadState }{Body: h}, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-thread-history-get", Method: http.MethodGet, Path: "/threads/{thread_id}/history", Tags: tags,
		Summary: "A thread's states, newest first (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Limit    int    `query:"limit" minimum:"1" maximum:"1000" default:"10"`
		Before   string `query:"before"`
	}) (*struct{ Body []ThreadState }, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		h, err := s.history(ctx, id, historyBody{Limit: in.Limit, Before: in.Before})
		return &struct{ Body []ThreadState }{Body: h}, err
	})
}

// A thread's history is one key per state (keyspace.AgentThreadHistoryState),
// apart from its state record, so that an outcome writes only its run's
// states and a reader of the state reads no history. A record of the
// previous layout holds the history itself (stateRecord.History); it is
// read as the history while the thread has no history key, and its next
// write converts it.

// historyBase is the position of the newest state of a history written
// whole; an appended state goes below its anchor's, so positions count
// down from here as a history grows (2^62 of them: never exhausted).
const historyBase uint64 = 1 << 62

// maxHistoryKept bounds a thread's history: its states are keys, and an
// outcome writes its run's in one transaction, under etcd's default of
// 128 operations.
const maxHistoryKept = 100

// historyKeyBytes is what an outcome counts of a history key and its
// operation beside the state's JSON.
const historyKeyBytes = 128

// historyPos is the position of history state key (its last 16 hex digits).
func historyPos(key []byte) uint64 {
	p, _ := strconv.ParseUint(string(key[max(len(key)-16, 0):]), 16, 64)
	return p
}

// historyEnd is the end of the range of thread's history states.
func historyEnd(sp keyspace.Space, thread string) string {
	return clientv3.GetPrefixRangeEnd(sp.AgentThreadHistoryStates(thread))
}

// historyWrites are the operations that put thread's history states
// (encoded, newest first) at positions p0 on, and delete the stored states
// newer than them and those at p0+keep or after (keep >= len(states)): the
// stored states in between stay. Puts and deletes never overlap, as etcd
// asks of one transaction.
func historyWrites(sp keyspace.Space, thread string, states [][]byte, p0 uint64, keep int) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpDelete(sp.AgentThreadHistoryStates(thread), clientv3.WithRange(sp.AgentThreadHistoryState(thread, p0))),
		clientv3.OpDelete(sp.AgentThreadHistoryState(thread, p0+uint64(keep)), clientv3.WithRange(historyEnd(sp, thread)))}
	for i, raw := range states {
		ops = append(ops, clientv3.OpPut(sp.AgentThreadHistoryState(thread, p0+uint64(i)), string(raw)))
	}
	return ops
}

// historyWhole are the operations that make hist (newest first, at most
// maxHistoryKept) thread's whole history, with its gap mark or without.
func historyWhole(sp keyspace.Space, thread string, hist []ThreadState, gap bool) []clientv3.Op {
	enc := encodedStates(hist, maxHistoryKept, maxStoredState)
	ops := historyWrites(sp, thread, enc, historyBase, len(enc))
	if gap {
		return append(ops, clientv3.OpPut(sp.AgentThreadHistoryGap(thread), "1"))
	}
	return append(ops, clientv3.OpDelete(sp.AgentThreadHistoryGap(thread)))
}

// encodedStates is the JSON of states, newest first: at most limit, as
// many as fit room bytes with their keys.
func encodedStates(states []ThreadState, limit, room int) [][]byte {
	out := make([][]byte, 0, min(len(states), limit))
	for _, st := range states[:min(len(states), limit)] {
		b, _ := json.Marshal(st)
		if room -= len(b) + historyKeyBytes; room < 0 {
			break
		}
		out = append(out, b)
	}
	return out
}

// recordJSON is the state record of state st (its JSON), as stored.
func recordJSON(st []byte) string { return `{"state":` + string(st) + `}` }

// storedHistory is a thread's history as read: its newest states and their
// keys, or a legacy record's states (no keys), and its state record.
type storedHistory struct {
	states []ThreadState
	kvs    []*mvccpb.KeyValue
	legacy bool
	gap    bool
	rec    stateRecord
	recKV  *mvccpb.KeyValue
}

// readHistory reads thread's history, its newest limit states (all for 0;
// all of a legacy record), its gap mark and its state record (decoded with
// record, or when the thread has no history key), at one revision.
func (s *server) readHistory(ctx context.Context, sp keyspace.Space, thread string, limit int64, record bool) (storedHistory, error) {
	resp, err := s.cfg.Etcd.Txn(ctx).Then(
		clientv3.OpGet(sp.AgentThreadHistoryStates(thread), clientv3.WithRange(historyEnd(sp, thread)), clientv3.WithLimit(limit)),
		clientv3.OpGet(sp.AgentThreadHistoryGap(thread), clientv3.WithCountOnly()), clientv3.OpGet(sp.AgentThreadState(thread))).Commit()
	if err != nil {
		return storedHistory{}, etcdError("reading the thread's history", err)
	}
	rr := resp.Responses
	h := storedHistory{kvs: rr[0].GetResponseRange().Kvs, gap: rr[1].GetResponseRange().Count > 0, rec: stateRecord{State: emptyState()}}
	if kvs := rr[2].GetResponseRange().Kvs; len(kvs) > 0 {
		h.recKV = kvs[0]
		if record || len(h.kvs) == 0 {
			if err := json.Unmarshal(kvs[0].Value, &h.rec); err != nil {
				return storedHistory{}, undecodable("thread state", thread, err)
			}
		}
	}
	if len(h.kvs) == 0 && h.rec.History != nil {
		h.legacy, h.states, h.gap = true, h.rec.History, h.rec.Gap
		return h, nil
	}
	h.states = make([]ThreadState, len(h.kvs))
	for i, kv := range h.kvs {
		if err := json.Unmarshal(kv.Value, &h.states[i]); err != nil {
			return storedHistory{}, undecodable("thread history state", thread, err)
		}
	}
	return h, nil
}

// threadHistory is readHistory of an existing thread (404 otherwise).
func (s *server) threadHistory(ctx context.Context, thread string, limit int64) (storedHistory, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return storedHistory{}, err
	}
	if _, _, err := s.getThread(ctx, thread); err != nil {
		return storedHistory{}, err
	}
	return s.readHistory(ctx, sp, thread, limit, false)
}

// emptyState is the state of a thread no run has ended on.
func emptyState() ThreadState {
	return ThreadState{Values: map[string]any{}, Next: []string{}, Tasks: []any{}, Metadata: map[string]any{}}
}
