package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// MaxRegisterBytes is the largest body of an endpoint registration: its data
// may be up to registry.MaxDataLen (64 KiB), with room for the rest.
const MaxRegisterBytes = 128 << 10

// EndpointBody is a registered endpoint as the API shows it. Its lease is
// not shown: for an endpoint registered over the API it is the session's
// id, which with a token proves what the session holds.
type EndpointBody struct {
	Component      string          `json:"component" doc:"The component it is registered under."`
	ID             string          `json:"id" doc:"The endpoint's id, unique within its component."`
	Subject        string          `json:"subject,omitempty" doc:"Its subject; default {namespace}.{component}.{id}."`
	Address        string          `json:"address" doc:"Where to reach it."`
	Data           json.RawMessage `json:"data,omitempty" doc:"What it publishes about itself (load figures...): a JSON object."`
	CreateRevision int64           `json:"create_revision" doc:"The etcd revision it was registered at."`
	ModRevision    int64           `json:"mod_revision" doc:"The etcd revision it was last written at."`
}

func endpointBodyOf(in registry.Instance) EndpointBody {
	return EndpointBody{Component: in.Component, ID: in.ID, Subject: in.Subject, Address: in.Address, Data: in.Data,
		CreateRevision: in.CreateRevision, ModRevision: in.ModRevision}
}

// WorkerBody is a live queue worker, as `drover workers` shows it.
type WorkerBody struct {
	ID          string    `json:"id" doc:"The worker's id (--worker-id; default host:pid)."`
	Address     string    `json:"address" doc:"The host it runs on."`
	Queue       string    `json:"queue" doc:"The queue it works."`
	Concurrency int       `json:"concurrency" doc:"Tasks it runs at once, at most."`
	Prefetch    int       `json:"prefetch" doc:"Tasks it claims ahead."`
	InFlight    int64     `json:"in_flight" doc:"Tasks it holds now (refreshed every 2 s)."`
	Claimed     int64     `json:"claimed" doc:"Tasks it claimed since it started."`
	Succeeded   int64     `json:"succeeded" doc:"Tasks that succeeded."`
	Failed      int64     `json:"failed" doc:"Runs that failed (retried or dead)."`
	PID         int       `json:"pid" doc:"Its process id."`
	Host        string    `json:"host" doc:"Its host name."`
	StartedAt   time.Time `json:"started_at" doc:"When it started."`
	Lease       string    `json:"lease" doc:"Its lease, in hex: its entry and its claims end with it."`
}

type componentPath struct {
	Component string `path:"component" doc:"The component: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
}

type endpointPath struct {
	Component string `path:"component" doc:"The component: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
	ID        string `path:"id" doc:"The endpoint's id: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
}

type registerInput struct {
	Component string `path:"component" doc:"The component to register under: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
	ID        string `path:"id" doc:"The endpoint's id, unique within the component: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
	Body      struct {
		Session string          `json:"session" doc:"The session to bind the endpoint to: it disappears when the session ends."`
		Address string          `json:"address" doc:"Where to reach the endpoint (required, at most 1024 bytes)."`
		Subject string          `json:"subject,omitempty" doc:"Its subject (at most 1024 bytes); default {namespace}.{component}.{id}."`
		Data    json.RawMessage `json:"data,omitempty" doc:"A JSON object of at most 64 KiB: load figures and the like."`
	}
}

type registerOutput struct {
	Status int
	Body   EndpointBody
}

type deregisterInput struct {
	Component string `path:"component" doc:"The component."`
	ID        string `path:"id" doc:"The endpoint's id."`
	Session   string `query:"session" required:"true" doc:"The session the endpoint was registered under."`
}

// registryWhere maps the registry package's input names to the request's.
var registryWhere = map[string]string{"endpoint id": "path.id", "component": "path.component", "address": "body.address", "subject": "body.subject", "data": "body.data"}

// registryRoutes registers the registry routes: endpoints registered under
// sessions, listed, watched (registry_watch.go), and the live workers.
func (s *Server) registryRoutes() {
	tags := []string{"registry"}
	huma.Register(s.api, huma.Operation{
		OperationID: "register-endpoint", Method: http.MethodPut, Path: "/v1/registry/{component}/{id}", Tags: tags,
		Summary: "Register an endpoint under a session",
		Description: "201 when created, 200 when the session already held it (rewritten in place: watchers see one put). 409 when " +
			"another session or process holds the id. The endpoint disappears when the session ends.",
		MaxBodyBytes: MaxRegisterBytes,
		Errors:       []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict},
	}, s.registerEndpoint)
	huma.Register(s.api, huma.Operation{
		OperationID: "deregister-endpoint", Method: http.MethodDelete, Path: "/v1/registry/{component}/{id}", Tags: tags,
		Summary:       "Withdraw an endpoint registered under a session",
		Description:   "404 when it is not registered under that session (absent, or another's): nothing is deleted then.",
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{http.StatusNotFound},
	}, func(ctx context.Context, in *deregisterInput) (*struct{}, error) {
		if err := checkEndpointPath(endpointPath{in.Component, in.ID}); err != nil {
			return nil, err
		}
		sess, err := s.session(ctx, "query.session", in.Session)
		if err != nil {
			return nil, err
		}
		if err := registry.DeleteLeased(ctx, s.cli, s.nsOf(ctx), in.Component, in.ID, sess.id); err != nil {
			return nil, problem(err, registryWhere)
		}
		return nil, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "list-endpoints", Method: http.MethodGet, Path: "/v1/registry/{component}", Tags: tags,
		Summary: "The live endpoints of a component",
	}, func(ctx context.Context, in *componentPath) (*struct{ Body []EndpointBody }, error) {
		if err := checkKeyName("path.component", in.Component); err != nil {
			return nil, err
		}
		list, _, err := registry.List(ctx, s.cli, s.nsOf(ctx), in.Component)
		if err != nil {
			return nil, problem(err, registryWhere)
		}
		out := make([]EndpointBody, len(list))
		for i, in := range list {
			out[i] = endpointBodyOf(in)
		}
		return &struct{ Body []EndpointBody }{out}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "get-endpoint", Method: http.MethodGet, Path: "/v1/registry/{component}/{id}", Tags: tags,
		Summary: "One live endpoint", Description: "404 when it is not registered. (An endpoint whose id is watch is listed, not read here.)",
		Errors: []int{http.StatusNotFound},
	}, s.getEndpoint)
	huma.Register(s.api, huma.Operation{
		OperationID: "list-workers", Method: http.MethodGet, Path: "/v1/workers", Tags: tags,
		Summary: "The live queue workers and their load",
		Description: "Every `drover worker` registers itself (component worker) under its lease and refreshes its load every few " +
			"seconds; a dead worker drops out within its TTL. As `drover workers`.",
	}, s.listWorkers)
	s.watchRoutes()
}

// checkEndpointPath is a 400 unless the component and id are valid names.
func checkEndpointPath(p endpointPath) error {
	if err := checkKeyName("path.component", p.Component); err != nil {
		return err
	}
	return checkKeyName("path.id", p.ID)
}

func (s *Server) registerEndpoint(ctx context.Context, in *registerInput) (*registerOutput, error) {
	if err := checkEndpointPath(endpointPath{in.Component, in.ID}); err != nil {
		return nil, err
	}
	b := in.Body
	ep := registry.Endpoint{ID: in.ID, Subject: b.Subject, Address: b.Address, Data: b.Data}
	if err := ep.Check(); err != nil {
		return nil, problem(err, registryWhere)
	}
	sess, err := s.session(ctx, "body.session", b.Session)
	if err != nil {
		return nil, err
	}
	got, created, err := registry.PutLeased(ctx, s.cli, s.nsOf(ctx), in.Component, ep, sess.id)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, sessionGone(b.Session, s.nsOf(ctx))
	}
	if err != nil {
		return nil, problem(err, registryWhere)
	}
	status := http.StatusOK
	if created {
		status = http.StatusCreated
	}
	return &registerOutput{Status: status, Body: endpointBodyOf(got)}, nil
}

func (s *Server) getEndpoint(ctx context.Context, in *endpointPath) (*struct{ Body EndpointBody }, error) {
	if err := checkEndpointPath(*in); err != nil {
		return nil, err
	}
	keys := s.keys(ctx)
	g, err := s.cli.Get(ctx, keys.Endpoint(in.Component, in.ID))
	if err != nil {
		return nil, problem(err, nil)
	}
	if len(g.Kvs) == 0 {
		return nil, newProblem(http.StatusNotFound, "not-found", "component "+in.Component+" has no endpoint "+in.ID+" (never registered, withdrawn, or its lease ended)")
	}
	got, _ := registry.Decode(keys, g.Kvs[0])
	return &struct{ Body EndpointBody }{endpointBodyOf(got)}, nil
}

func (s *Server) listWorkers(ctx context.Context, in *struct {
	Queue string `query:"queue" doc:"Only the workers of this queue."`
}) (*struct{ Body []WorkerBody }, error) {
	if in.Queue != "" {
		if err := drover.Rename(queue.CheckQueue(in.Queue), "query.queue"); err != nil {
			return nil, problem(err, nil)
		}
	}
	list, _, err := registry.List(ctx, s.cli, s.nsOf(ctx), registry.WorkerComponent)
	if err != nil {
		return nil, problem(err, nil)
	}
	out := []WorkerBody{}
	for _, w := range list {
		var d registry.WorkerInfo
		_ = json.Unmarshal(w.Data, &d)
		if in.Queue != "" && d.Queue != in.Queue {
			continue
		}
		out = append(out, WorkerBody{ID: w.ID, Address: w.Address, Queue: d.Queue, Concurrency: d.Concurrency, Prefetch: d.Prefetch,
			InFlight: d.InFlight, Claimed: d.Claimed, Succeeded: d.Succeeded, Failed: d.Failed, PID: d.PID, Host: d.Host,
			StartedAt: d.StartedAt, Lease: formatLease(w.Lease)})
	}
	return &struct{ Body []WorkerBody }{out}, nil
}

// formatLease is a lease as the API shows it: hex, as session ids are.
func formatLease(id int64) string {
	if id == 0 {
		return ""
	}
	return strconv.FormatInt(id, 16)
}
