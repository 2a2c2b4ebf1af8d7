package budget

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// HTTPConfig configures the budget routes. Etcd and Namespace are required.
type HTTPConfig struct {
	// Etcd stores the budgets.
	Etcd *clientv3.Client
	// Namespace returns the namespace of a request, as the API's
	// authentication resolved it.
	Namespace func(ctx context.Context) string
	// Admin, if set, is called on the routes that change a budget's
	// configuration (set, delete), so that the API can require its admin
	// role for them.
	Admin func(op *huma.Operation)
}

// DefaultHTTPTTL is the lease of a reservation made over HTTP without
// ttl_seconds: unsettled after that long, it is released.
const DefaultHTTPTTL = 60

// routes holds the HTTP handlers' state: one Client per namespace, so
// that a namespace's writers of one budget queue in this process instead
// of failing each other's compare-and-swap.
type routes struct {
	cfg     HTTPConfig
	mu      sync.Mutex
	clients map[string]*Client
}

// Register adds the budget routes to api under /v1/budgets. A budget key
// holds '/': clients escape it as one path segment
// (/v1/budgets/openai%2Fgpt-4.1%2Fkey-prod/reserve).
func Register(api huma.API, cfg HTTPConfig) error {
	if cfg.Etcd == nil {
		return errors.New("budget: HTTPConfig.Etcd must be an etcd client")
	}
	if cfg.Namespace == nil {
		return errors.New("budget: HTTPConfig.Namespace must resolve a request's namespace")
	}
	r := &routes{cfg: cfg, clients: map[string]*Client{}}
	r.register(api)
	return nil
}

// client returns the request's namespace's client.
func (r *routes) client(ctx context.Context) (*Client, error) {
	ns := r.cfg.Namespace(ctx)
	if _, err := keyspace.New(ns); err != nil {
		return nil, huma.NewError(http.StatusInternalServerError, fmt.Sprintf("budget: the request's namespace %q is not usable: %v", ns, err))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	c := r.clients[ns]
	if c == nil {
		c = New(r.cfg.Etcd, ns)
		r.clients[ns] = c
	}
	return c, nil
}

func (r *routes) admin(op huma.Operation) huma.Operation {
	if op.Metadata == nil {
		op.Metadata = map[string]any{}
	}
	if r.cfg.Admin != nil {
		r.cfg.Admin(&op)
	}
	return op
}

type budgetKeyPath struct {
	Key string `path:"key" doc:"The budget's key, such as openai/gpt-4.1/key-prod, with each '/' escaped as %2F."`
}

type statusOutput struct{ Body Usage }

type budgetSetInput struct {
	Key  string `path:"key" doc:"The budget's key, such as openai/gpt-4.1/key-prod, with each '/' escaped as %2F."`
	Body struct {
		Requests      int64              `json:"requests,omitempty" doc:"The most reservations per window (0 or absent: no limit)."`
		Tokens        int64              `json:"tokens,omitempty" doc:"The most tokens reserved or used per window (0 or absent: no limit). Requests, tokens or both are set."`
		WindowSeconds int64              `json:"window_seconds,omitempty" doc:"The window, 1 to 86400 seconds (default 60)."`
		Caps          map[string]int64   `json:"caps,omitempty" doc:"The most tokens a tenant may take per window, by tenant."`
		Weights       map[string]float64 `json:"weights,omitempty" doc:"Tenants' weights (above 0, at most 1000; a tenant not named weighs 1): a saturated budget is shared in proportion."`
		Estimates     map[string]int64   `json:"estimates,omitempty" doc:"Default estimates by task type (1 to the budget's tokens per window): a reservation, or queue task, that names its task type and no estimate holds its type's."`
	}
}

type budgetReserveInput struct {
	Key  string `path:"key" doc:"The budget's key, such as openai/gpt-4.1/key-prod, with each '/' escaped as %2F."`
	Body struct {
		Tenant     string `json:"tenant,omitempty" doc:"Whom the call is for; shares and caps apply per tenant."`
		Estimate   *int64 `json:"estimate,omitempty" doc:"Tokens to hold: the call's estimated tokens, 0 to the budget's tokens per window. Absent or 0 with task_type: the budget's default estimate for that type. Required unless task_type names a type with a default estimate."`
		TaskType   string `json:"task_type,omitempty" doc:"The task type the call is for: without an estimate, the budget's default estimate for this type is held."`
		TTLSeconds int64  `json:"ttl_seconds,omitempty" doc:"Seconds the reservation lives unless settled (1 to 3600, default 60): then it is released."`
	}
}

type reservationOutput struct{ Body Reservation }

type budgetSettleInput struct {
	Key  string `path:"key" doc:"The budget's key, such as openai/gpt-4.1/key-prod, with each '/' escaped as %2F."`
	ID   string `path:"id" doc:"The reservation's id, as reserve returned it."`
	Body struct {
		Actual  int64             `json:"actual" doc:"Tokens the call actually used, 0 to the reservation's settle_bound: fewer than the estimate refunds the rest, more charges the difference."`
		Headers map[string]string `json:"headers,omitempty" doc:"The provider's response headers x-ratelimit-remaining-tokens and x-ratelimit-reset-tokens, if any: they lower drover's remaining tokens to the provider's."`
	}
}

type settlementOutput struct{ Body Settlement }

func (r *routes) register(api huma.API) {
	tags := []string{"budgets"}
	huma.Register(api, huma.Operation{
		OperationID: "list-budgets", Method: http.MethodGet, Path: "/v1/budgets", Tags: tags,
		Summary: "Every budget, with its usage in the current window",
	}, func(ctx context.Context, _ *struct{}) (*struct {
		Body struct {
			Data []Usage `json:"data"`
		}
	}, error) {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		list, err := c.List(ctx)
		if err != nil {
			return nil, problem(err)
		}
		out := &struct {
			Body struct {
				Data []Usage `json:"data"`
			}
		}{}
		out.Body.Data = list
		return out, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "get-budget", Method: http.MethodGet, Path: "/v1/budgets/{key}", Tags: tags,
		Summary: "A budget, with its usage in the current window: used, reserved, remaining, per tenant",
		Errors:  []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *budgetKeyPath) (*statusOutput, error) {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		s, err := c.Get(ctx, in.Key)
		if err != nil {
			return nil, problem(err)
		}
		return &statusOutput{s}, nil
	})
	huma.Register(api, r.admin(huma.Operation{
		OperationID: "set-budget", Method: http.MethodPut, Path: "/v1/budgets/{key}", Tags: tags,
		Summary:     "Set (or create) a budget",
		Description: "As `drover budgets set`. The current window's counters and live reservations stay.",
		Errors:      []int{http.StatusBadRequest},
	}), func(ctx context.Context, in *budgetSetInput) (*statusOutput, error) {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		b := Budget{Key: in.Key, Requests: in.Body.Requests, Tokens: in.Body.Tokens, WindowSeconds: in.Body.WindowSeconds,
			Caps: in.Body.Caps, Weights: in.Body.Weights, Estimates: in.Body.Estimates}
		if _, err := c.Set(ctx, b); err != nil {
			return nil, problem(err)
		}
		s, err := c.Get(ctx, in.Key)
		if err != nil {
			return nil, problem(err)
		}
		return &statusOutput{s}, nil
	})
	huma.Register(api, r.admin(huma.Operation{
		OperationID: "delete-budget", Method: http.MethodDelete, Path: "/v1/budgets/{key}", Tags: tags,
		Summary: "Delete a budget: its configuration, counters and reservations", DefaultStatus: http.StatusNoContent,
		Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}), func(ctx context.Context, in *budgetKeyPath) (*struct{}, error) {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		return nil, problem(c.Delete(ctx, in.Key))
	})
	r.registerReserve(api, tags)
}

func (r *routes) registerReserve(api huma.API, tags []string) {
	huma.Register(api, huma.Operation{
		OperationID: "reserve-budget", Method: http.MethodPost, Path: "/v1/budgets/{key}/reserve", Tags: tags,
		Summary: "Reserve tokens of a budget before a model call",
		Description: "Holds estimate tokens and one request of the budget for tenant, under a lease of ttl_seconds. " +
			"429 with Retry-After when the window, the tenant's cap or its fair share has no room (nothing is held then). " +
			"503 with Retry-After 30 when the budget's counters are of a window far ahead of the server's clock (a clock skew: " +
			"fix the clocks). Settle with the tokens actually used.",
		DefaultStatus: http.StatusCreated,
		Errors:        []int{http.StatusBadRequest, http.StatusNotFound, http.StatusTooManyRequests, http.StatusServiceUnavailable},
	}, func(ctx context.Context, in *budgetReserveInput) (*reservationOutput, error) {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		ttl := in.Body.TTLSeconds
		if ttl == 0 {
			ttl = DefaultHTTPTTL
		}
		opts := []ReserveOption{WithTTL(ttl), WithTaskType(in.Body.TaskType)}
		var estimate int64
		if in.Body.Estimate != nil {
			estimate = *in.Body.Estimate
		} else {
			opts = append(opts, func(o *reserveOpts) { o.needEstimate = true })
		}
		res, err := c.Reserve(ctx, in.Key, in.Body.Tenant, estimate, opts...)
		if err != nil {
			return nil, problem(err)
		}
		return &reservationOutput{res}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "settle-budget", Method: http.MethodPost, Path: "/v1/budgets/{key}/reservations/{id}/settle", Tags: tags,
		Summary: "Settle a reservation with the tokens the call actually used",
		Description: "Releases the estimate and counts actual: the difference is refunded or charged. The provider's " +
			"rate-limit headers, when given, lower the remaining tokens to the provider's count. 409 when the reservation " +
			"is unknown, already settled, or was released when its lease ended.",
		Errors: []int{http.StatusBadRequest, http.StatusConflict},
	}, func(ctx context.Context, in *budgetSettleInput) (*settlementOutput, error) {
		c, err := r.client(ctx)
		if err != nil {
			return nil, err
		}
		h := http.Header{}
		for k, v := range in.Body.Headers {
			h.Set(k, v)
		}
		s, err := c.Settle(ctx, Reservation{ID: in.ID, Budget: in.Key}, in.Body.Actual, h)
		if err != nil {
			return nil, problem(err)
		}
		return &settlementOutput{s}, nil
	})
}

// where is the request location of each field an InputError names.
var where = map[string]string{
	"key": "path.key", "id": "path.id", "estimate": "body.estimate", "tenant": "body.tenant", "ttl": "body.ttl_seconds", "task_type": "body.task_type",
	"actual": "body.actual", "requests": "body.requests", "tokens": "body.tokens", "window_seconds": "body.window_seconds",
}

// skewRetrySeconds is the Retry-After of a clock skew: as often as the
// fleet gate retries a task that meets one.
const skewRetrySeconds = 30

// problem is the RFC 9457 problem of err (nil for nil): 400 for bad input,
// 404 for a budget not configured, 409 for a reservation not held, 429
// with Retry-After for a deferral, 503 with Retry-After 30 for a clock
// skew, 503 with Retry-After 1 otherwise (etcd did not answer).
func problem(err error) error {
	var in *drover.InputError
	var d *drover.DeferError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &in):
		loc := where[in.Field]
		if loc == "" { // "caps acme" is body.caps.acme
			loc = "body." + strings.Replace(in.Field, " ", ".", 1)
		}
		return huma.NewError(http.StatusBadRequest, err.Error(), &huma.ErrorDetail{Location: loc, Value: in.Value, Message: in.Rule})
	case errors.Is(err, ErrNoBudget):
		return huma.NewError(http.StatusNotFound, err.Error())
	case errors.Is(err, ErrNotReserved):
		return huma.NewError(http.StatusConflict, err.Error())
	case errors.Is(err, ErrClockSkew):
		// Not over in a second: a clock must be fixed first.
		return withHeaders{huma.NewError(http.StatusServiceUnavailable, err.Error()), http.Header{"Retry-After": {strconv.Itoa(skewRetrySeconds)}}}
	case errors.As(err, &d):
		secs := max(1, int64(math.Ceil(d.After.Seconds())))
		// The detail is the reason a queue task's deferral records
		// (budget KEY: why); Retry-After says for how long.
		return withHeaders{huma.NewError(http.StatusTooManyRequests, d.Reason), http.Header{"Retry-After": {strconv.FormatInt(secs, 10)}}}
	}
	return withHeaders{huma.NewError(http.StatusServiceUnavailable, err.Error()+"; retry"), http.Header{"Retry-After": {"1"}}}
}

// withHeaders is an error whose answer carries headers (huma sends a
// HeadersError's headers; the problem itself is the wrapped error).
type withHeaders struct {
	error
	h http.Header
}

func (e withHeaders) Unwrap() error           { return e.error }
func (e withHeaders) GetHeaders() http.Header { return e.h }
