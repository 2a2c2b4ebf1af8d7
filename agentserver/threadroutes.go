package agentserver

import (
	"context"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
)

type threadOutput struct {
	Body Thread
}

type threadPath struct {
	ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
}

// threadID is the thread id of a path, checked and in lower case.
func threadID(id string) (string, error) {
	if !isUUID(id) {
		return "", badInput("path.thread_id", id, "must be a UUID")
	}
	return strings.ToLower(id), nil
}

type createThreadInput struct {
	Body struct {
		ThreadID   string         `json:"thread_id,omitempty" doc:"Its id, a UUID; one is made when none is given."`
		Metadata   map[string]any `json:"metadata,omitempty"`
		IfExists   string         `json:"if_exists,omitempty" enum:"raise,do_nothing" doc:"When the id is taken: raise (409, the default) or do_nothing (the existing thread)."`
		Supersteps []superstep    `json:"supersteps,omitempty" doc:"State updates to apply at creation, in order, through the runtime of the graph its metadata's graph_id names; a refused one stores nothing."`
		TTL        any            `json:"ttl,omitempty" doc:"A time to live: not served yet (501)."`
	}
}

type searchThreadsInput struct {
	Body struct {
		Metadata  map[string]any `json:"metadata,omitempty" doc:"Only threads whose metadata contains this (as jsonb @>)."`
		Values    map[string]any `json:"values,omitempty" doc:"Only threads whose values contain this."`
		Status    string         `json:"status,omitempty" enum:"idle,busy,interrupted,error"`
		IDs       []string       `json:"ids,omitempty" doc:"Only these threads."`
		Limit     int            `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"10"`
		Offset    int            `json:"offset,omitempty" minimum:"0" maximum:"2147483647"`
		SortBy    string         `json:"sort_by,omitempty" enum:"thread_id,status,created_at,updated_at"`
		SortOrder string         `json:"sort_order,omitempty" enum:"asc,desc"`
		Select    []string       `json:"select,omitempty" enum:"thread_id,created_at,updated_at,metadata,status,config,values,interrupts" doc:"Only these fields of each thread."`
		Extract   any            `json:"extract,omitempty" doc:"Paths of values to extract: not served yet (501)."`
	}
}

func (s *server) threadRoutes(api huma.API) {
	tags := []string{tagThreads}
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-thread", Method: http.MethodPost, Path: "/threads", Tags: tags,
		Summary: "Create a thread (LangGraph)", Description: "409 when its id is taken and if_exists is raise.",
		Errors: []int{http.StatusBadRequest, http.StatusConflict, http.StatusNotImplemented},
	}, s.createThreadRoute)
	huma.Register(api, huma.Operation{
		OperationID: "lg-get-thread", Method: http.MethodGet, Path: "/threads/{thread_id}", Tags: tags,
		Summary: "A thread (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID string   `path:"thread_id" doc:"The thread's id, a UUID."`
		Include  []string `query:"include" doc:"Extra fields LangGraph may add (ttl); none is served yet, so it is ignored."`
	}) (*threadOutput, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		t, _, err := s.getThread(ctx, id)
		if err != nil {
			return nil, err
		}
		if t.Status == "busy" { // its runs' read settles one whose task ended without an outcome
			if _, err := s.listRuns(ctx, id); err != nil {
				return nil, err
			}
			if t, _, err = s.getThread(ctx, id); err != nil {
				return nil, err
			}
		}
		return &threadOutput{Body: t}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-update-thread", Method: http.MethodPatch, Path: "/threads/{thread_id}", Tags: tags,
		Summary: "Merge metadata into a thread's (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		Body     struct {
			Metadata map[string]any `json:"metadata,omitempty" doc:"Keys to merge into its metadata."`
			TTL      any            `json:"ttl,omitempty" doc:"A time to live: not served yet (501)."`
		}
	}) (*threadOutput, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		if in.Body.TTL != nil {
			return nil, notBuilt("body.ttl", "a thread's time to live")
		}
		t, err := s.patchThread(ctx, id, in.Body.Metadata)
		if err != nil {
			return nil, err
		}
		return &threadOutput{Body: t}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-delete-thread", Method: http.MethodDelete, Path: "/threads/{thread_id}", Tags: tags,
		Summary: "Delete a thread (LangGraph)", DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *threadPath) (*struct{}, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		return nil, s.deleteThread(ctx, id)
	})
	s.threadListRoutes(api, tags)
	s.pruneRoutes(api)
}

func (s *server) threadListRoutes(api huma.API, tags []string) {
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-search-threads", Method: http.MethodPost, Path: "/threads/search", Tags: tags,
		Summary: "Search threads (LangGraph)", Description: "Newest first unless sort_by and sort_order say otherwise.",
		Errors: []int{http.StatusBadRequest, http.StatusNotImplemented},
	}), func(ctx context.Context, in *searchThreadsInput) (*pagedOutput, error) {
		b := in.Body
		for i, id := range b.IDs {
			if !isUUID(id) {
				return nil, badInput("body.ids["+itoa(i)+"]", id, "must be a UUID")
			}
			b.IDs[i] = strings.ToLower(id)
		}
		if b.Extract != nil {
			return nil, notBuilt("body.extract", "extracting values")
		}
		list, err := s.listThreads(ctx, threadFilter{Metadata: b.Metadata, Values: b.Values, Status: b.Status}, b.IDs, b.SortBy, b.SortOrder)
		if err != nil {
			return nil, err
		}
		lo, hi, total, next := page(len(list), b.Offset, b.Limit)
		out := &pagedOutput{Total: total, Next: next, Body: []any{}}
		for _, t := range list[lo:hi] {
			v, err := selectFields(t, b.Select)
			if err != nil {
				return nil, err
			}
			out.Body = append(out.Body, v)
		}
		return out, nil
	})
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-count-threads", Method: http.MethodPost, Path: "/threads/count", Tags: tags,
		Summary: "Count threads (LangGraph)", Errors: []int{http.StatusBadRequest},
	}), func(ctx context.Context, in *struct{ Body threadFilter }) (*struct{ Body int }, error) {
		list, err := s.listThreads(ctx, in.Body, nil, "", "")
		if err != nil {
			return nil, err
		}
		return &struct{ Body int }{Body: len(list)}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-copy-thread", Method: http.MethodPost, Path: "/threads/{thread_id}/copy", Tags: tags,
		Summary:     "Copy a thread (LangGraph)",
		Description: "A new thread with the old one's metadata (thread_id set to the new id), values, checkpoints, state and history, as LangGraph copies a thread; not its runs.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *threadPath) (*threadOutput, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		t, err := s.copyThread(ctx, id)
		if err != nil {
			return nil, err
		}
		return &threadOutput{Body: t}, nil
	})
}

// createThreadRoute serves POST /threads.
func (s *server) createThreadRoute(ctx context.Context, in *createThreadInput) (*threadOutput, error) {
	b := in.Body
	now := s.now()
	id := s.ids.next(now)
	if b.ThreadID != "" {
		if !isUUID(b.ThreadID) {
			return nil, badInput("body.thread_id", b.ThreadID, "must be a UUID")
		}
		id = strings.ToLower(b.ThreadID)
	}
	graph, _ := b.Metadata["graph_id"].(string)
	if err := checkSupersteps(b.Supersteps, graph); err != nil {
		return nil, err
	}
	if b.TTL != nil {
		return nil, notBuilt("body.ttl", "a thread's time to live")
	}
	t := Thread{ThreadID: id, CreatedAt: now, UpdatedAt: now, Metadata: orEmpty(b.Metadata), Status: "idle",
		Config: map[string]any{}, Interrupts: map[string]any{}}
	t, err := s.createThread(ctx, t, b.IfExists == "do_nothing" && len(b.Supersteps) == 0)
	if err != nil {
		return nil, err
	}
	if len(b.Supersteps) == 0 {
		return &threadOutput{Body: t}, nil
	}
	if t, err = s.applySupersteps(ctx, t.ThreadID, b.Supersteps); err != nil {
		return nil, err
	}
	return &threadOutput{Body: t}, nil
}
