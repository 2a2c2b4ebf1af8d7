package agentserver

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Graph is what a runtime registers for a graph it serves: its drawing,
// its JSON schemas and subgraphs, and the config of its system assistant.
type Graph struct {
	GraphID      string         `json:"graph_id,omitempty" doc:"The graph's name, as the runtime's langgraph.json gives it."`
	Config       map[string]any `json:"config,omitempty" doc:"The config of the graph's system assistant (LANGGRAPH_CONFIG)."`
	Context      any            `json:"context,omitempty" doc:"The context of the graph's system assistant."`
	Description  *string        `json:"description,omitempty" doc:"The system assistant's description."`
	Drawing      any            `json:"graph,omitempty" doc:"The graph's drawing (nodes and edges), as GET /assistants/{id}/graph answers it."`
	XrayDrawing  any            `json:"xray_graph,omitempty" doc:"The drawing with subgraphs expanded, for ?xray=true."`
	InputSchema  any            `json:"input_schema,omitempty" doc:"JSON schema of the graph's input."`
	OutputSchema any            `json:"output_schema,omitempty" doc:"JSON schema of its output."`
	StateSchema  any            `json:"state_schema,omitempty" doc:"JSON schema of its state."`
	ConfigSchema any            `json:"config_schema,omitempty" doc:"JSON schema of its configurable."`
	ContextSch   any            `json:"context_schema,omitempty" doc:"JSON schema of its context."`
	Subgraphs    map[string]any `json:"subgraphs,omitempty" doc:"Its subgraphs' schemas, by namespace."`
	UpdatedAt    time.Time      `json:"updated_at,omitzero" readOnly:"true"`
}

// graphSchemas is LangGraph's answer to GET /assistants/{id}/schemas.
type graphSchemas struct {
	GraphID       string `json:"graph_id"`
	InputSchema   any    `json:"input_schema"`
	OutputSchema  any    `json:"output_schema"`
	StateSchema   any    `json:"state_schema"`
	ConfigSchema  any    `json:"config_schema"`
	ContextSchema any    `json:"context_schema"`
}

func (g Graph) schemas() graphSchemas {
	return graphSchemas{GraphID: g.GraphID, InputSchema: g.InputSchema, OutputSchema: g.OutputSchema,
		StateSchema: g.StateSchema, ConfigSchema: g.ConfigSchema, ContextSchema: g.ContextSch}
}

// registerGraph stores g's registration (replacing an earlier one) and
// creates its system assistant unless it exists; it answers the
// assistant.
func (s *server) registerGraph(ctx context.Context, g Graph) (Assistant, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Assistant{}, err
	}
	now := s.now()
	g.UpdatedAt = now
	raw, _ := json.Marshal(g)
	resp, err := s.cfg.Etcd.Txn(ctx).If(storeguard.NotFull(sp)).Then(clientv3.OpPut(sp.AgentGraph(g.GraphID), string(raw))).
		Else(storeguard.GetOp(sp)).Commit()
	if err != nil {
		return Assistant{}, etcdError("registering the graph", err)
	}
	if !resp.Succeeded {
		if err := guardOf(resp, 0); err != nil {
			return Assistant{}, err
		}
	}
	ctxv := g.Context
	if ctxv == nil {
		ctxv = map[string]any{}
	}
	a := Assistant{AssistantID: graphAssistantID(g.GraphID), GraphID: g.GraphID, Config: orEmpty(g.Config), Context: ctxv,
		CreatedAt: now, UpdatedAt: now, Metadata: map[string]any{"created_by": "system"}, Version: 1, Name: g.GraphID, Description: g.Description}
	return s.createAssistant(ctx, a, true)
}

// getGraph reads graph id's registration; 404 when no runtime made one.
func (s *server) getGraph(ctx context.Context, id string) (Graph, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return Graph{}, err
	}
	resp, err := s.cfg.Etcd.Get(ctx, sp.AgentGraph(id))
	if err != nil {
		return Graph{}, etcdError("reading the graph", err)
	}
	if len(resp.Kvs) == 0 {
		return Graph{}, huma.NewError(http.StatusNotFound, fmt.Sprintf("Graph %s not found: no runtime registered it", id))
	}
	var g Graph
	if err := json.Unmarshal(resp.Kvs[0].Value, &g); err != nil {
		return Graph{}, undecodable("graph", id, err)
	}
	return g, nil
}

// graphOf reads the registration of assistant id's graph.
func (s *server) graphOf(ctx context.Context, assistant string) (Graph, error) {
	rec, _, err := s.getAssistant(ctx, assistant)
	if err != nil {
		return Graph{}, err
	}
	return s.getGraph(ctx, rec.GraphID)
}

type graphInput struct {
	GraphID string `path:"graph_id" minLength:"1" maxLength:"256" doc:"The graph's name."`
	Body    Graph
}

func (s *server) graphRoutes(api huma.API) {
	huma.Register(api, huma.Operation{
		OperationID: "agent-server-register-graph", Method: http.MethodPut, Path: "/v1/agent-server/graphs/{graph_id}", Tags: []string{tagAssistants},
		Summary:     "Register a graph a runtime serves",
		Description: "Stores the graph's drawing, schemas and subgraphs (replacing an earlier registration) and creates its system assistant (id uuid5 of the graph's name, metadata created_by: system) unless it exists. Answers the system assistant.",
		Errors:      []int{http.StatusBadRequest},
	}, func(ctx context.Context, in *graphInput) (*assistantOutput, error) {
		if strings.TrimSpace(in.GraphID) == "" || strings.Contains(in.GraphID, "/") {
			return nil, badInput("path.graph_id", in.GraphID, "must name a graph, without '/'")
		}
		g := in.Body
		if g.GraphID != "" && g.GraphID != in.GraphID {
			return nil, badInput("body.graph_id", g.GraphID, "must be the path's graph_id or absent")
		}
		g.GraphID = in.GraphID
		a, err := s.registerGraph(ctx, g)
		if err != nil {
			return nil, err
		}
		return &assistantOutput{Body: a}, nil
	})
	s.drawingRoutes(api)
}

// drawingRoutes serve what a runtime registered of an assistant's graph.
func (s *server) drawingRoutes(api huma.API) {
	tags := []string{tagAssistants}
	huma.Register(api, huma.Operation{
		OperationID: "lg-assistant-graph", Method: http.MethodGet, Path: "/assistants/{assistant_id}/graph", Tags: tags,
		Summary: "An assistant's graph drawing (LangGraph)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
		Xray        string `query:"xray" doc:"true, or a depth: the drawing with subgraphs expanded."`
	}) (*struct{ Body any }, error) {
		g, err := s.graphOf(ctx, in.AssistantID)
		if err != nil {
			return nil, err
		}
		if in.Xray != "" && in.Xray != "false" && in.Xray != "0" && g.XrayDrawing != nil {
			return &struct{ Body any }{Body: g.XrayDrawing}, nil
		}
		if g.Drawing == nil {
			return &struct{ Body any }{Body: map[string]any{"nodes": []any{}, "edges": []any{}}}, nil
		}
		return &struct{ Body any }{Body: g.Drawing}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-assistant-schemas", Method: http.MethodGet, Path: "/assistants/{assistant_id}/schemas", Tags: tags,
		Summary: "An assistant's graph schemas (LangGraph)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *assistantPath) (*struct{ Body graphSchemas }, error) {
		g, err := s.graphOf(ctx, in.AssistantID)
		if err != nil {
			return nil, err
		}
		return &struct{ Body graphSchemas }{Body: g.schemas()}, nil
	})
	subgraphs := func(ctx context.Context, id, ns string, recurse bool) (*struct{ Body map[string]any }, error) {
		g, err := s.graphOf(ctx, id)
		if err != nil {
			return nil, err
		}
		return &struct{ Body map[string]any }{Body: subgraphsOf(g.Subgraphs, ns, recurse)}, nil
	}
	huma.Register(api, huma.Operation{
		OperationID: "lg-assistant-subgraphs", Method: http.MethodGet, Path: "/assistants/{assistant_id}/subgraphs", Tags: tags,
		Summary: "An assistant's subgraphs' schemas (LangGraph)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
		Recurse     bool   `query:"recurse" doc:"Subgraphs of subgraphs too, at every depth."`
	}) (*struct{ Body map[string]any }, error) {
		return subgraphs(ctx, in.AssistantID, "", in.Recurse)
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-assistant-subgraphs-of", Method: http.MethodGet, Path: "/assistants/{assistant_id}/subgraphs/{namespace}", Tags: tags,
		Summary: "The subgraphs of one namespace of an assistant's graph (LangGraph)", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		AssistantID string `path:"assistant_id" doc:"The assistant's id, or the name of a graph."`
		Namespace   string `path:"namespace" doc:"The subgraph's namespace."`
		Recurse     bool   `query:"recurse" doc:"Subgraphs of subgraphs too, at every depth."`
	}) (*struct{ Body map[string]any }, error) {
		return subgraphs(ctx, in.AssistantID, in.Namespace, in.Recurse)
	})
}

// subgraphsOf is what LangGraph's getSubgraphs answers of a graph whose
// subgraphs, at every depth, are all (namespaces joined by '|'): the
// graph's own subgraphs, or those of namespace ns (ns itself first), and
// with recurse theirs too.
func subgraphsOf(all map[string]any, ns string, recurse bool) map[string]any {
	out := map[string]any{}
	for k, v := range all {
		switch {
		case ns == "" && (recurse || !strings.Contains(k, "|")):
			out[k] = v
		case ns != "" && (k == ns || recurse && strings.HasPrefix(k, ns+"|")):
			out[k] = v
		}
	}
	return out
}

// TruncateEnv names the environment variable that, set to 1 when the
// server starts, serves POST /internal/truncate: the reset LangGraph's
// own test suite calls between tests. It is never served otherwise.
const TruncateEnv = "DROVER_AGENT_SERVER_TRUNCATE"

type truncateInput struct {
	Body struct {
		Runs       bool `json:"runs,omitempty" doc:"Delete every run."`
		Threads    bool `json:"threads,omitempty" doc:"Delete every thread (and its runs)."`
		Assistants bool `json:"assistants,omitempty" doc:"Delete every assistant but the graphs' system assistants."`
		Checkpoint bool `json:"checkpoint,omitempty" doc:"Delete every checkpoint of the namespace."`
		Store      bool `json:"store,omitempty" doc:"Delete the store's items."`
	}
}

func (s *server) truncateRoute(api huma.API) {
	huma.Register(api, huma.Operation{
		OperationID: "lg-internal-truncate", Method: http.MethodPost, Path: "/internal/truncate", Tags: []string{tagThreads},
		Summary:     "Reset the namespace's Agent Server state, for tests (LangGraph)",
		Description: "Served only when the server starts with " + TruncateEnv + "=1. Deletes what the body names; the graphs' registrations and system assistants stay.",
		Errors:      []int{http.StatusServiceUnavailable},
	}, func(ctx context.Context, in *truncateInput) (*struct{}, error) {
		sp, err := s.space(ctx)
		if err != nil {
			return nil, err
		}
		b := in.Body
		var ops []clientv3.Op
		if b.Runs || b.Threads {
			ops = append(ops, clientv3.OpDelete(sp.AgentRuns(""), clientv3.WithPrefix()), clientv3.OpDelete(sp.AgentActiveRuns(""), clientv3.WithPrefix()))
		}
		if b.Threads {
			ops = append(ops, clientv3.OpDelete(sp.AgentThreads(), clientv3.WithPrefix()),
				clientv3.OpDelete(sp.AgentThreadStates(), clientv3.WithPrefix()), clientv3.OpDelete(sp.AgentThreadHistories(), clientv3.WithPrefix()))
		}
		if b.Checkpoint {
			ops = append(ops, clientv3.OpDelete(sp.CheckpointThreads(), clientv3.WithPrefix()))
		}
		if b.Store {
			ops = append(ops, clientv3.OpDelete(sp.AgentStore(), clientv3.WithPrefix()))
		}
		if b.Assistants {
			resp, err := s.cfg.Etcd.Get(ctx, sp.AgentAssistants(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				return nil, etcdError("listing assistants", err)
			}
			graphs, err := s.cfg.Etcd.Get(ctx, sp.AgentGraphs(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
			if err != nil {
				return nil, etcdError("listing graphs", err)
			}
			system := map[string]bool{}
			for _, kv := range graphs.Kvs {
				system[graphAssistantID(idOf(kv.Key))] = true
			}
			for _, kv := range resp.Kvs {
				if id := idOf(kv.Key); !system[id] {
					ops = append(ops, clientv3.OpDelete(string(kv.Key)), clientv3.OpDelete(sp.AgentAssistantVersions(id), clientv3.WithPrefix()))
				}
			}
		}
		for len(ops) > 0 { // etcd takes at most 128 operations per transaction by default
			n := min(len(ops), 100)
			if _, err := s.cfg.Etcd.Txn(ctx).Then(ops[:n]...).Commit(); err != nil {
				return nil, etcdError("truncating", err)
			}
			ops = ops[n:]
		}
		return nil, nil
	})
}
