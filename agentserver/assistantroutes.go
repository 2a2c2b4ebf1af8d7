package agentserver

import (
	"context"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
)

type assistantOutput struct {
	Body Assistant
}

type assistantPath struct {
	AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph, which stands for the assistant its runtime registered."`
}

type createAssistantInput struct {
	Body struct {
		AssistantID string         `json:"assistant_id,omitempty" doc:"Its id, a UUID; one is made when none is given."`
		GraphID     string         `json:"graph_id" minLength:"1" doc:"The graph it runs."`
		Config      map[string]any `json:"config,omitempty"`
		Context     any            `json:"context,omitempty"`
		Metadata    map[string]any `json:"metadata,omitempty"`
		IfExists    string         `json:"if_exists,omitempty" enum:"raise,do_nothing" doc:"When the id is taken: raise (409, the default) or do_nothing (the existing assistant)."`
		Name        string         `json:"name,omitempty" doc:"Its name; the graph's when none is given."`
		Description *string        `json:"description,omitempty"`
	}
}

type patchAssistantInput struct {
	AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
	Body        assistantPatch
}

type searchAssistantsInput struct {
	Body struct {
		GraphID   string         `json:"graph_id,omitempty" doc:"Only assistants of this graph."`
		Name      string         `json:"name,omitempty" doc:"Only assistants whose name contains this, ignoring case."`
		Metadata  map[string]any `json:"metadata,omitempty" doc:"Only assistants whose metadata contains this (as jsonb @>)."`
		Limit     int            `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"10"`
		Offset    int            `json:"offset,omitempty" minimum:"0" maximum:"2147483647"`
		SortBy    string         `json:"sort_by,omitempty" enum:"assistant_id,graph_id,name,created_at,updated_at"`
		SortOrder string         `json:"sort_order,omitempty" enum:"asc,desc"`
		Select    []string       `json:"select,omitempty" enum:"assistant_id,graph_id,config,context,created_at,updated_at,metadata,version,name,description" doc:"Only these fields of each assistant."`
	}
}

// pagedOutput is a page of a search, with LangGraph's pagination headers.
type pagedOutput struct {
	Total string `header:"X-Pagination-Total" doc:"How many match."`
	Next  string `header:"X-Pagination-Next" doc:"The offset of the next page, when there is one."`
	Body  []any
}

func (s *server) assistantRoutes(api huma.API) {
	tags := []string{tagAssistants}
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-assistant", Method: http.MethodPost, Path: "/assistants", Tags: tags,
		Summary:     "Create an assistant (LangGraph)",
		Description: "Version 1 of an assistant of a graph. 409 when its id is taken and if_exists is raise.",
		Errors:      []int{http.StatusBadRequest, http.StatusConflict},
	}, func(ctx context.Context, in *createAssistantInput) (*assistantOutput, error) {
		b := in.Body
		id := s.ids.next(s.now())
		if b.AssistantID != "" {
			if !isUUID(b.AssistantID) {
				return nil, badInput("body.assistant_id", b.AssistantID, "must be a UUID")
			}
			id = strings.ToLower(b.AssistantID)
		}
		if strings.TrimSpace(b.GraphID) == "" {
			return nil, badInput("body.graph_id", b.GraphID, "must name a graph")
		}
		now := s.now()
		a := Assistant{AssistantID: id, GraphID: b.GraphID, Config: orEmpty(b.Config), Context: b.Context, CreatedAt: now, UpdatedAt: now,
			Metadata: orEmpty(b.Metadata), Version: 1, Name: b.Name, Description: b.Description}
		if a.Name == "" {
			a.Name = b.GraphID
		}
		if a.Context == nil {
			a.Context = map[string]any{}
		}
		a, err := s.createAssistant(ctx, a, b.IfExists == "do_nothing")
		if err != nil {
			return nil, err
		}
		return &assistantOutput{Body: a}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-get-assistant", Method: http.MethodGet, Path: "/assistants/{assistant_id}", Tags: tags,
		Summary: "An assistant (LangGraph)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *assistantPath) (*assistantOutput, error) {
		r, _, err := s.getAssistant(ctx, in.AssistantID)
		if err != nil {
			return nil, err
		}
		return &assistantOutput{Body: r.Assistant}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-update-assistant", Method: http.MethodPatch, Path: "/assistants/{assistant_id}", Tags: tags,
		Summary:     "Update an assistant: a new version (LangGraph)",
		Description: "The fields given replace the assistant's, metadata merges into its metadata; the result is a new version, which becomes the one in use.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *patchAssistantInput) (*assistantOutput, error) {
		if g := in.Body.GraphID; g != nil && strings.TrimSpace(*g) == "" {
			return nil, badInput("body.graph_id", *g, "must name a graph")
		}
		a, err := s.patchAssistant(ctx, in.AssistantID, in.Body)
		if err != nil {
			return nil, err
		}
		return &assistantOutput{Body: a}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-delete-assistant", Method: http.MethodDelete, Path: "/assistants/{assistant_id}", Tags: tags,
		Summary: "Delete an assistant and its versions (LangGraph)", DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		AssistantID   string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
		DeleteThreads bool   `query:"delete_threads" doc:"Delete too the threads whose metadata names this assistant."`
	}) (*struct{}, error) {
		return nil, s.deleteAssistant(ctx, in.AssistantID, in.DeleteThreads)
	})
	s.assistantListRoutes(api, tags)
}

func (s *server) assistantListRoutes(api huma.API, tags []string) {
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-search-assistants", Method: http.MethodPost, Path: "/assistants/search", Tags: tags,
		Summary: "Search assistants (LangGraph)", Description: "Newest first unless sort_by and sort_order say otherwise.",
		Errors: []int{http.StatusBadRequest},
	}), func(ctx context.Context, in *searchAssistantsInput) (*pagedOutput, error) {
		b := in.Body
		list, err := s.listAssistants(ctx, assistantFilter{GraphID: b.GraphID, Name: b.Name, Metadata: b.Metadata}, b.SortBy, b.SortOrder)
		if err != nil {
			return nil, err
		}
		lo, hi, total, next := page(len(list), b.Offset, b.Limit)
		out := &pagedOutput{Total: total, Next: next, Body: []any{}}
		for _, a := range list[lo:hi] {
			v, err := selectFields(a, b.Select)
			if err != nil {
				return nil, err
			}
			out.Body = append(out.Body, v)
		}
		return out, nil
	})
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-count-assistants", Method: http.MethodPost, Path: "/assistants/count", Tags: tags,
		Summary: "Count assistants (LangGraph)", Errors: []int{http.StatusBadRequest},
	}), func(ctx context.Context, in *struct{ Body assistantFilter }) (*struct{ Body int }, error) {
		list, err := s.listAssistants(ctx, in.Body, "", "")
		if err != nil {
			return nil, err
		}
		return &struct{ Body int }{Body: len(list)}, nil
	})
	huma.Register(api, s.readOnly(huma.Operation{
		OperationID: "lg-assistant-versions", Method: http.MethodPost, Path: "/assistants/{assistant_id}/versions", Tags: tags,
		Summary: "An assistant's versions, newest first (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}), func(ctx context.Context, in *struct {
		AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
		Body        struct {
			Limit    int            `json:"limit,omitempty" minimum:"1" maximum:"1000" default:"10"`
			Offset   int            `json:"offset,omitempty" minimum:"0" maximum:"2147483647"`
			Metadata map[string]any `json:"metadata,omitempty" doc:"Only versions whose metadata contains this."`
		}
	}) (*struct{ Body []AssistantVersion }, error) {
		vs, err := s.versions(ctx, in.AssistantID, in.Body.Metadata)
		if err != nil {
			return nil, err
		}
		lo, hi, _, _ := page(len(vs), in.Body.Offset, in.Body.Limit)
		return &struct{ Body []AssistantVersion }{Body: vs[lo:hi]}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-set-latest-assistant-version", Method: http.MethodPost, Path: "/assistants/{assistant_id}/latest", Tags: tags,
		Summary: "Put a version of an assistant back in use (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
		Body        struct {
			Version int `json:"version" minimum:"1" doc:"The version to use."`
		}
	}) (*assistantOutput, error) {
		a, err := s.setLatest(ctx, in.AssistantID, in.Body.Version)
		if err != nil {
			return nil, err
		}
		return &assistantOutput{Body: a}, nil
	})
}

// orEmpty is m, or an empty map for nil: LangGraph answers {} not null.
func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}
