package httpapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/flow"
)

// BreakerConfigBody is when a breaker opens and how long it stays open.
type BreakerConfigBody struct {
	Failures int     `json:"failures" doc:"Consecutive failures that open the breaker."`
	Cooldown string  `json:"cooldown" doc:"How long it stays open before one probe call is let through (Go duration)."`
	Ratio    float64 `json:"ratio,omitempty" doc:"When above 0: also open when at least this share of the calls in a window failed."`
	Window   string  `json:"window,omitempty" doc:"The ratio's window (Go duration)."`
	MinCalls int64   `json:"min_calls,omitempty" doc:"Calls a window needs before its ratio counts."`
}

// BreakerBody is a circuit breaker shared by the fleet: its thresholds and
// its state.
type BreakerBody struct {
	Name        string            `json:"name" doc:"The breaker's name."`
	State       string            `json:"state" enum:"closed,open,half-open" doc:"closed: calls go; open: calls are held off until the cooldown passes; half-open: one probe call decides."`
	Consecutive int               `json:"consecutive_failures" doc:"Failures since the last success."`
	Since       time.Time         `json:"since,omitzero" doc:"When the breaker entered its state."`
	Probe       string            `json:"probe,omitempty" doc:"While half-open: the call let through as the probe."`
	Opened      int64             `json:"opened" doc:"How many times the breaker opened."`
	Config      BreakerConfigBody `json:"config" doc:"Its thresholds."`
}

func breakerBodyOf(b flow.BreakerStatus) BreakerBody {
	c := b.Config
	cfg := BreakerConfigBody{Failures: c.Failures, Cooldown: c.Cooldown.String(), Ratio: c.Ratio, MinCalls: c.MinCalls}
	if c.Window > 0 {
		cfg.Window = c.Window.String()
	}
	return BreakerBody{Name: b.Name, State: b.State, Consecutive: b.Consecutive, Since: b.Since, Probe: b.Probe, Opened: b.Opened, Config: cfg}
}

// AllowBody is the answer to a call that may go ahead.
type AllowBody struct {
	Allowed bool        `json:"allowed" doc:"Always true (a call held off is a 503)."`
	Call    string      `json:"call" doc:"The call's id: report its outcome with it."`
	Probe   bool        `json:"probe" doc:"Whether the call is the half-open probe: its outcome closes or reopens the breaker for the fleet."`
	Breaker BreakerBody `json:"breaker" doc:"The breaker now."`
}

type breakerPath struct {
	Name string `path:"name" doc:"The breaker's name."`
}

type setBreakerInput struct {
	Name string `path:"name" doc:"The breaker's name."`
	Body struct {
		Failures *int     `json:"failures,omitempty" doc:"Consecutive failures that open it (1 to 1000000)."`
		Cooldown *string  `json:"cooldown,omitempty" doc:"How long it stays open (Go duration, 100ms to 24h)."`
		Ratio    *float64 `json:"ratio,omitempty" doc:"Failure ratio that also opens it (0 off, up to 1); giving one defaults window to 1m and min_calls to 20."`
		Window   *string  `json:"window,omitempty" doc:"The ratio's window (Go duration, 1s to 24h)."`
		MinCalls *int64   `json:"min_calls,omitempty" doc:"Calls a window needs before its ratio counts (1 to 1e9)."`
	}
}

type allowInput struct {
	Name string `path:"name" doc:"The breaker's name."`
	// Body is optional (a pointer, so huma does not require it): a POST
	// with no body asks with a made-up call id.
	Body *struct {
		Call string `json:"call,omitempty" maxLength:"128" doc:"An id for the call; one is made up when omitted. Report the outcome with the same id."`
	}
}

type outcomeInput struct {
	Name string `path:"name" doc:"The breaker's name."`
	Body struct {
		OK   bool   `json:"ok" doc:"Whether the call succeeded. Report failures of the resource only (timeouts, 5xx), not the caller's own bad input."`
		Call string `json:"call,omitempty" maxLength:"128" doc:"The id allow returned: a half-open probe's outcome counts only with it."`
	}
}

type breakerOutput struct{ Body BreakerBody }

func (s *Server) breakerRoutes() {
	tags := []string{"flow control"}
	huma.Register(s.api, huma.Operation{
		OperationID: "list-breakers", Method: http.MethodGet, Path: "/v1/breakers", Tags: tags,
		Summary: "Every circuit breaker, with its state",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body []BreakerBody }, error) {
		bs, err := flow.Breakers(ctx, s.cli, s.nsOf(ctx))
		if err != nil {
			return nil, problem(err, nil)
		}
		out := make([]BreakerBody, len(bs))
		for i, b := range bs {
			out[i] = breakerBodyOf(b)
		}
		return &struct{ Body []BreakerBody }{out}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "get-breaker", Method: http.MethodGet, Path: "/v1/breakers/{name}", Tags: tags,
		Summary: "A circuit breaker, with its state", Errors: []int{http.StatusNotFound},
	}, s.breakerCall(func(ctx context.Context, ns, name string) (flow.BreakerStatus, error) {
		return flow.GetBreaker(ctx, s.cli, ns, name)
	}))
	huma.Register(s.api, huma.Operation{
		OperationID: "set-breaker", Method: http.MethodPut, Path: "/v1/breakers/{name}", Tags: tags,
		Summary:     "Set (or create) a breaker's thresholds; every worker follows within a second",
		Description: "Changes the fields given and keeps the others (a new breaker starts from failures 5, cooldown 30s). Needs the admin role.",
		Metadata:    adminRole,
	}, s.setBreaker)
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-breaker", Method: http.MethodDelete, Path: "/v1/breakers/{name}", Tags: tags,
		Summary: "Delete a breaker: its configuration and state", Description: "Needs the admin role; 404 when it is not configured.",
		Metadata: adminRole, DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *breakerPath) (*struct{}, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		if err := flow.DeleteBreaker(ctx, s.cli, s.nsOf(ctx), in.Name); err != nil {
			return nil, problem(err, nil)
		}
		return nil, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "reset-breaker", Method: http.MethodPost, Path: "/v1/breakers/{name}/reset", Tags: tags,
		Summary: "Close a breaker for the whole fleet", Description: "Needs the admin role.",
		Metadata: adminRole, Errors: []int{http.StatusNotFound},
	}, s.breakerCall(func(ctx context.Context, ns, name string) (flow.BreakerStatus, error) {
		return flow.ResetCall(ctx, s.cli, ns, name)
	}))
	huma.Register(s.api, huma.Operation{
		OperationID: "allow-call", Method: http.MethodPost, Path: "/v1/breakers/{name}/allow", Tags: tags,
		Summary: "Ask a breaker whether a call may go to its resource",
		Description: "200 when the call may go (as the half-open probe, past an open breaker's cooldown); 503 breaker-open with " +
			"Retry-After while the breaker holds calls off. Report the call's outcome afterwards.",
		Errors: []int{http.StatusNotFound, http.StatusServiceUnavailable},
	}, s.allowCall)
	huma.Register(s.api, huma.Operation{
		OperationID: "report-outcome", Method: http.MethodPost, Path: "/v1/breakers/{name}/outcome", Tags: tags,
		Summary:     "Report a call's outcome to a breaker",
		Description: "A failure counts toward opening the breaker (for the whole fleet); a success resets the count, and closes a half-open breaker when it is the probe's.",
		Errors:      []int{http.StatusNotFound},
	}, func(ctx context.Context, in *outcomeInput) (*breakerOutput, error) {
		return s.breakerCall(func(ctx context.Context, ns, name string) (flow.BreakerStatus, error) {
			return flow.RecordCall(ctx, s.cli, ns, name, in.Body.Call, !in.Body.OK)
		})(ctx, &breakerPath{Name: in.Name})
	})
}

// breakerCall is a handler of a breaker route that calls f on the
// request's breaker and answers with the breaker.
func (s *Server) breakerCall(f func(ctx context.Context, ns, name string) (flow.BreakerStatus, error)) func(context.Context, *breakerPath) (*breakerOutput, error) {
	return func(ctx context.Context, in *breakerPath) (*breakerOutput, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		b, err := f(ctx, s.nsOf(ctx), in.Name)
		if err != nil {
			return nil, problem(err, nil)
		}
		return &breakerOutput{breakerBodyOf(b)}, nil
	}
}

func (s *Server) setBreaker(ctx context.Context, in *setBreakerInput) (*breakerOutput, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	b := in.Body
	dur := func(location string, v *string) (*time.Duration, error) {
		if v == nil {
			return nil, nil
		}
		d, err := time.ParseDuration(*v)
		if err != nil {
			return nil, invalid(location, *v, "must be a duration such as 30s or 1m")
		}
		return &d, nil
	}
	cooldown, err := dur("body.cooldown", b.Cooldown)
	if err != nil {
		return nil, err
	}
	window, err := dur("body.window", b.Window)
	if err != nil {
		return nil, err
	}
	cfg, err := flow.UpdateBreaker(ctx, s.cli, s.nsOf(ctx), in.Name, func(c *flow.BreakerConfig) error {
		if b.Failures != nil {
			c.Failures = *b.Failures
		}
		if cooldown != nil {
			c.Cooldown = *cooldown
		}
		if b.Ratio != nil {
			c.Ratio = *b.Ratio
			if c.Window == 0 {
				c.Window = time.Minute
			}
			if c.MinCalls == 0 {
				c.MinCalls = 20
			}
		}
		if window != nil {
			c.Window = *window
		}
		if b.MinCalls != nil {
			c.MinCalls = *b.MinCalls
		}
		return nil
	})
	if err != nil {
		return nil, problem(err, map[string]string{"breaker failures": "body.failures", "breaker cooldown": "body.cooldown",
			"breaker ratio": "body.ratio", "breaker window": "body.window", "breaker min-calls": "body.min_calls"})
	}
	st, err := flow.GetBreaker(ctx, s.cli, s.nsOf(ctx), in.Name)
	if err != nil {
		st = flow.BreakerStatus{Name: in.Name, Config: cfg, BreakerState: flow.BreakerState{State: flow.Closed}}
	}
	return &breakerOutput{breakerBodyOf(st)}, nil
}

func (s *Server) allowCall(ctx context.Context, in *allowInput) (*struct{ Body AllowBody }, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	var call string
	if in.Body != nil {
		call = in.Body.Call
	}
	if call == "" {
		var b [8]byte
		_, _ = rand.Read(b[:])
		call = "call-" + hex.EncodeToString(b[:])
	}
	st, err := flow.AllowCall(ctx, s.cli, s.nsOf(ctx), in.Name, call)
	var de *flow.DeferError
	if errors.As(err, &de) {
		p := newProblem(http.StatusServiceUnavailable, "breaker-open",
			fmt.Sprintf("breaker %s is %s after %d consecutive failures: calls to its resource are held off for the whole fleet; retry in %s",
				in.Name, st.State, st.Consecutive, de.After.Round(time.Millisecond)))
		p.headers = http.Header{"Retry-After": {retryAfter(de.After.Seconds())}}
		return nil, p
	}
	if err != nil {
		return nil, problem(err, nil)
	}
	probe := st.State == flow.HalfOpen && st.Probe == call
	return &struct{ Body AllowBody }{AllowBody{Allowed: true, Call: call, Probe: probe, Breaker: breakerBodyOf(st)}}, nil
}
