package httpapi

import (
	"context"
	"net/http"
	"sort"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	"github.com/droverhq/drover/ui"
)

// QueueSummary is a queue with its counts by status and its settings.
type QueueSummary struct {
	Name      string `json:"name" doc:"The queue's name."`
	Scheduled int64  `json:"scheduled" doc:"Submitted to run later, not yet due."`
	Pending   int64  `json:"pending" doc:"Waiting to be claimed."`
	Running   int64  `json:"running" doc:"Claimed by a worker."`
	Retrying  int64  `json:"retrying" doc:"Failed, waiting for their next attempt."`
	Succeeded int64  `json:"succeeded" doc:"Finished with a result (those past their retention included)."`
	Dead      int64  `json:"dead" doc:"In the dead-letter queue."`
	Cancelled int64  `json:"cancelled" doc:"Cancelled."`
	Sleeping  int64  `json:"sleeping" doc:"Step tasks parked until the sleep their last step ended with is over."`
	Waiting   int64  `json:"waiting" doc:"Step tasks parked until a signal they wait for comes or their wait times out."`
	MaxDepth  int64  `json:"max_depth" doc:"The most unfinished tasks the queue takes (0: no bound)."`
	FIFO      bool   `json:"fifo" doc:"Whether tasks of equal priority are claimed exactly in submission order."`
	Paused    bool   `json:"paused" doc:"Whether the queue is paused: it takes submissions, but no worker claims its tasks until it is resumed."`

	stats queue.Stats // the counts read, for the server's gauges
}

// Whoami is what the request's token may do, and where.
type Whoami struct {
	Auth       bool     `json:"auth" doc:"Whether the server requires a token; without, every request may do everything."`
	Name       string   `json:"name" doc:"The token's name in the auth file (anonymous without auth)."`
	Role       string   `json:"role" enum:"read,write,admin" doc:"What the token may do: read; write (also change data); admin (also change settings and purge)."`
	Namespace  string   `json:"namespace" doc:"The namespace of the request: its Drover-Namespace header, else the server's."`
	Allowed    bool     `json:"allowed" doc:"Whether the token may use the request's namespace (whoami answers either way; every other route answers 403 when not)."`
	Default    string   `json:"default_namespace" doc:"The server's namespace (--namespace): the one of a request without Drover-Namespace."`
	Namespaces []string `json:"namespaces" doc:"The namespaces the token may use, as its auth file lists them; [\"*\"] is every one (and always without auth)."`
}

// ComponentBody is a registered component with its live endpoints.
type ComponentBody struct {
	Component string         `json:"component" doc:"The component's name."`
	Endpoints []EndpointBody `json:"endpoints" doc:"Its live endpoints, by id."`
}

type whoamiInput struct{}

// dashboardRoutes registers the routes the dashboard reads beside the
// others: every queue at once, every component at once, what the token may
// do, lock waiters, the Paxos group, the history and the event stream.
func (s *Server) dashboardRoutes() {
	tags := []string{"dashboard"}
	huma.Register(s.api, huma.Operation{
		OperationID: "list-queues", Method: http.MethodGet, Path: "/v1/queues", Tags: []string{"queues"},
		Summary:     "Every queue, with its counts by status and its settings",
		Description: "Every queue that was submitted to or configured, by name, as `drover queues list`.",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body []QueueSummary }, error) {
		qs, err := s.queueSummaries(ctx)
		if err != nil {
			return nil, err
		}
		return &struct{ Body []QueueSummary }{qs}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "list-components", Method: http.MethodGet, Path: "/v1/registry", Tags: []string{"registry"},
		Summary: "Every registered component, with its live endpoints",
	}, s.listComponents)
	huma.Register(s.api, huma.Operation{
		OperationID: "whoami", Method: http.MethodGet, Path: "/v1/whoami", Tags: tags,
		Summary: "What the request's token may do: its name, role and namespaces",
		Description: "Answers any valid token, whatever namespace the request names (`allowed` says whether the token may use it), " +
			"so a client can find the namespaces it may use. 401 without a valid token when the server requires one: the dashboard " +
			"asks it to find out whether to show its login, and where to start.",
		Metadata: map[string]any{"anyNamespace": true},
	}, s.whoami)
	s.waiterRoutes()
	s.paxosRoutes()
	s.historyRoutes()
	s.eventRoutes()
}

// queueSummaries reads every queue of the request's namespace.
func (s *Server) queueSummaries(ctx context.Context) ([]QueueSummary, error) {
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	infos, err := c.Queues(ctx)
	if err != nil {
		return nil, problem(err, nil)
	}
	out := make([]QueueSummary, len(infos))
	for i, q := range infos {
		st := q.Stats
		out[i] = QueueSummary{Name: q.Name, Scheduled: st.Scheduled, Pending: st.Pending, Running: st.Running, Retrying: st.Retrying, Succeeded: st.Succeeded,
			Dead: st.Dead, Cancelled: st.Cancelled, Sleeping: st.Sleeping, Waiting: st.Waiting, MaxDepth: q.Config.MaxDepth, FIFO: q.Config.FIFO, Paused: st.Paused, stats: st}
	}
	return out, nil
}

func (s *Server) listComponents(ctx context.Context, _ *struct{}) (*struct{ Body []ComponentBody }, error) {
	list, _, err := registry.List(ctx, s.cli, s.nsOf(ctx), "")
	if err != nil {
		return nil, problem(err, nil)
	}
	byName := map[string]*ComponentBody{}
	for _, in := range list {
		c := byName[in.Component]
		if c == nil {
			c = &ComponentBody{Component: in.Component}
			byName[in.Component] = c
		}
		c.Endpoints = append(c.Endpoints, endpointBodyOf(in))
	}
	out := make([]ComponentBody, 0, len(byName))
	for _, c := range byName {
		out = append(out, *c)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Component < out[j].Component })
	return &struct{ Body []ComponentBody }{out}, nil
}

func (s *Server) whoami(ctx context.Context, in *whoamiInput) (*struct{ Body Whoami }, error) {
	ns := s.nsOf(ctx)
	out := Whoami{Name: whoOf(ctx), Role: RoleAdmin.String(), Namespace: ns, Allowed: true, Default: s.cfg.Namespace, Namespaces: []string{"*"}}
	if s.cfg.Auth != nil {
		// authorize let the request through and kept the entry its token
		// (Authorization or X-Api-Key) matched.
		e, _ := ctx.Value(entryKey).(authEntry)
		out.Auth, out.Role, out.Namespaces, out.Allowed = true, e.role.String(), e.namespaces, e.allows(ns)
	}
	return &struct{ Body Whoami }{out}, nil
}

// mountUI serves the dashboard at /ui/ (package ui): static files only,
// without a token, since they hold no data; the pages read everything
// through the API's routes with the token the user gives them. / and /ui
// redirect to it.
func (s *Server) mountUI() {
	s.mux.Handle("GET /ui/", http.StripPrefix("/ui", ui.Handler()))
	s.mux.Handle("GET /ui", http.RedirectHandler("/ui/", http.StatusFound))
	s.mux.Handle("GET /{$}", http.RedirectHandler("/ui/", http.StatusFound))
}
