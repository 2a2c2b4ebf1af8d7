package agentserver

import (
	"context"
	"net/http"

	"github.com/danielgtaylor/huma/v2"
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
	rec, err := s.threadState(ctx, thread)
	if err != nil || id == "" {
		return rec.State, err
	}
	for _, st := range rec.History {
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

// history is thread's states, newest first, as b filters them.
func (s *server) history(ctx context.Context, thread string, b historyBody) ([]ThreadState, error) {
	rec, err := s.threadState(ctx, thread)
	if err != nil {
		return nil, err
	}
	before := ""
	if m, ok := b.Before.(map[string]any); ok {
		before, _ = m["checkpoint_id"].(string)
	} else if sid, ok := b.Before.(string); ok {
		before = sid
	}
	out := []ThreadState{}
	skipping := before != ""
	for _, st := range rec.History {
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
