package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/keyspace"
)

// LimitBody is a fleet-wide rate limit with its token bucket as it stands.
type LimitBody struct {
	Name      string  `json:"name" doc:"The limit's name."`
	Rate      string  `json:"rate" doc:"The rate, as set: 500/m, 20/s, 1000/h or N/DURATION."`
	PerSecond float64 `json:"per_second" doc:"The rate in tokens per second."`
	Burst     int64   `json:"burst" doc:"The most tokens the bucket holds: the largest take."`
	Available float64 `json:"available" doc:"Tokens in the bucket now (negative while a debt of calls that used more than they took is paid back)."`
	Used      int64   `json:"used" doc:"Tokens taken and not given back, in total: the limit's recorded usage."`
}

func limitBodyOf(u flow.LimitUsage) LimitBody {
	return LimitBody{Name: u.Name, Rate: u.Rate, PerSecond: u.PerSecond, Burst: u.Burst, Available: u.Available, Used: u.Used}
}

// TakeBody is the answer to a take: the tokens taken and the bucket after.
type TakeBody struct {
	Taken int64 `json:"taken" doc:"Tokens taken: n. Settle them with the count actually used."`
	LimitBody
}

type limitPath struct {
	Name string `path:"name" doc:"The rate limit's name: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
}

type takeInput struct {
	Name string `path:"name" doc:"The rate limit's name."`
	Body struct {
		N    int64  `json:"n" doc:"Tokens to take: 1 for a request, the estimated LLM tokens of a call. At least 1, at most the limit's burst."`
		Wait string `json:"wait,omitempty" doc:"How long to wait for the tokens (Go duration: 500ms, 10s; capped by the server's longest wait). Without it one attempt is made."`
	}
}

type settleInput struct {
	Name string `path:"name" doc:"The rate limit's name."`
	Body struct {
		Reserved int64 `json:"reserved" doc:"Tokens the call took (its take's n)."`
		Used     int64 `json:"used" doc:"Tokens it actually used: fewer gives the rest back to the fleet, more takes the difference as a debt that later takes pay."`
	}
}

type setLimitInput struct {
	Name string `path:"name" doc:"The rate limit's name: 1 to 128 letters, digits, '.', '_', '-' or ':'."`
	Body struct {
		Rate  string `json:"rate" doc:"N/s, N/m, N/h or N/DURATION (10/30s), between one a day and 1e9 a second."`
		Burst int64  `json:"burst,omitempty" doc:"The most tokens saved up while idle (1 to 1e9); default one second's worth, at least 1."`
	}
}

type limitOutput struct{ Body LimitBody }

// checkName is a 400 unless name is a valid name of a limit, quota or
// breaker (location names the input: "path.name").
func checkKeyName(location, name string) error {
	if err := keyspace.CheckName(location, name); err != nil {
		return problem(err, nil)
	}
	return nil
}

// admin marks an operation that changes settings.
var adminRole = map[string]any{"role": RoleAdmin}

// flowRoutes registers the flow control routes: rate limits and quotas
// here, breakers in flow_breakers.go.
func (s *Server) flowRoutes() {
	s.limitRoutes()
	s.quotaRoutes()
	s.breakerRoutes()
}

func (s *Server) limitRoutes() {
	tags := []string{"flow control"}
	huma.Register(s.api, huma.Operation{
		OperationID: "list-limits", Method: http.MethodGet, Path: "/v1/limits", Tags: tags,
		Summary: "Every rate limit, with its bucket now",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body []LimitBody }, error) {
		us, err := flow.Limits(ctx, s.cli, s.nsOf(ctx))
		if err != nil {
			return nil, problem(err, nil)
		}
		out := make([]LimitBody, len(us))
		for i, u := range us {
			out[i] = limitBodyOf(u)
		}
		return &struct{ Body []LimitBody }{out}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "get-limit", Method: http.MethodGet, Path: "/v1/limits/{name}", Tags: tags,
		Summary: "A rate limit, with its bucket now",
		Errors:  []int{http.StatusNotFound},
	}, func(ctx context.Context, in *limitPath) (*limitOutput, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		u, err := flow.GetLimit(ctx, s.cli, s.nsOf(ctx), in.Name)
		if err != nil {
			return nil, problem(err, nil)
		}
		return &limitOutput{limitBodyOf(u)}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "set-limit", Method: http.MethodPut, Path: "/v1/limits/{name}", Tags: tags,
		Summary:     "Set (or create) a rate limit; every worker follows within a second",
		Description: "As `drover limits set`. The bucket keeps its tokens (capped by the new burst). Needs the admin role.",
		Metadata:    adminRole,
	}, s.setLimit)
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-limit", Method: http.MethodDelete, Path: "/v1/limits/{name}", Tags: tags,
		Summary: "Delete a rate limit: its configuration and bucket", Description: "Needs the admin role; 404 when it is not configured.",
		Metadata: adminRole, DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *limitPath) (*struct{}, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		if err := flow.DeleteLimit(ctx, s.cli, s.nsOf(ctx), in.Name); err != nil {
			return nil, problem(err, nil)
		}
		return nil, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "take-tokens", Method: http.MethodPost, Path: "/v1/limits/{name}/take", Tags: tags,
		Summary: "Take tokens of a fleet-wide rate limit before a call",
		Description: "Spends n tokens of the limit's shared bucket, the one every worker of the fleet takes from. With wait, waits " +
			"for them; 429 with Retry-After when they cannot come within it (nothing is taken then). Settle with the count used.",
		Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusTooManyRequests},
	}, s.takeTokens)
	huma.Register(s.api, huma.Operation{
		OperationID: "settle-tokens", Method: http.MethodPost, Path: "/v1/limits/{name}/settle", Tags: tags,
		Summary: "Settle a take with the tokens actually used",
		Description: "Gives back reserved − used tokens (or takes used − reserved more as a debt), so that the limit's usage counts " +
			"what calls used: an LLM call takes its estimate, then settles its real token count.",
		Errors: []int{http.StatusNotFound},
	}, s.settleTokens)
}

func (s *Server) setLimit(ctx context.Context, in *setLimitInput) (*limitOutput, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	r, err := flow.ParseRate("body.rate", in.Body.Rate)
	if err != nil {
		return nil, problem(err, nil)
	}
	if in.Body.Burst != 0 {
		if err := flow.CheckBurst("body.burst", in.Body.Burst); err != nil {
			return nil, problem(err, nil)
		}
		r.Burst = in.Body.Burst
	}
	ns := s.nsOf(ctx)
	if err := flow.SetRate(ctx, s.cli, ns, in.Name, r); err != nil {
		return nil, problem(err, nil)
	}
	u, err := flow.GetLimit(ctx, s.cli, ns, in.Name)
	if err != nil {
		return nil, problem(err, nil)
	}
	return &limitOutput{limitBodyOf(u)}, nil
}

func (s *Server) takeTokens(ctx context.Context, in *takeInput) (*struct{ Body TakeBody }, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	n := in.Body.N
	if n < 1 {
		return nil, invalid("body.n", n, "must be at least 1")
	}
	wait, err := s.wait("body.wait", in.Body.Wait)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		res, err := flow.TakeTokens(ctx, s.cli, s.nsOf(ctx), in.Name, n)
		if errors.Is(err, flow.ErrExceedsBurst) {
			return nil, invalid("body.n", n, err.Error()+": take at most the burst (raise it with PUT /v1/limits/{name})")
		}
		if err != nil {
			return nil, problem(err, map[string]string{"n": "body.n"})
		}
		if res.Granted {
			return &struct{ Body TakeBody }{TakeBody{Taken: n, LimitBody: limitBodyOf(res.Usage)}}, nil
		}
		if res.RetryIn > time.Until(deadline) {
			p := newProblem(http.StatusTooManyRequests, "rate-limited",
				fmt.Sprintf("rate limit %s (%s, burst %d): %d tokens are not available within the wait (%.1f in the bucket now); nothing was taken; retry in %s",
					in.Name, res.Usage.Rate, res.Usage.Burst, n, res.Usage.Available, res.RetryIn.Round(time.Millisecond)))
			p.headers = http.Header{"Retry-After": {retryAfter(res.RetryIn.Seconds())}}
			return nil, p
		}
		t := time.NewTimer(res.RetryIn)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, problem(ctx.Err(), nil)
		case <-t.C:
		}
	}
}

func (s *Server) settleTokens(ctx context.Context, in *settleInput) (*limitOutput, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	b := in.Body
	if b.Reserved < 1 {
		return nil, invalid("body.reserved", b.Reserved, "must be at least 1: the n of the take being settled")
	}
	if b.Used < 0 {
		return nil, invalid("body.used", b.Used, "must not be negative")
	}
	u, err := flow.GiveTokens(ctx, s.cli, s.nsOf(ctx), in.Name, b.Reserved-b.Used)
	if err != nil {
		return nil, problem(err, nil)
	}
	return &limitOutput{limitBodyOf(u)}, nil
}
