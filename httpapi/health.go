package httpapi

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// HealthBody is the answer of /healthz and /readyz.
type HealthBody struct {
	Status string `json:"status" enum:"ok,unready" doc:"ok, or unready with the reasons"`
	// Reasons say why the server is not ready.
	Reasons []string `json:"reasons,omitempty"`
	// StoreFull says whether etcd's database is past the high-water mark:
	// submissions and checkpoints are refused, the rest works.
	StoreFull bool `json:"store_full"`
}

type healthOutput struct {
	Body HealthBody
}

func (s *Server) healthRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "healthz", Method: http.MethodGet, Path: "/healthz", Tags: []string{"operations"},
		Summary:  "Liveness: the process answers",
		Metadata: map[string]any{"public": true},
	}, func(ctx context.Context, _ *struct{}) (*healthOutput, error) {
		return &healthOutput{Body: HealthBody{Status: "ok"}}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "readyz", Method: http.MethodGet, Path: "/readyz", Tags: []string{"operations"},
		Summary:     "Readiness: etcd answers and the store is not full",
		Description: "503 when etcd does not answer within 2 s or the server's own check fails. A store past its high-water mark is still ready (locks and leases work) and says store_full.",
		Metadata:    map[string]any{"public": true},
		Errors:      []int{http.StatusServiceUnavailable},
	}, func(ctx context.Context, _ *struct{}) (*healthOutput, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		b := HealthBody{Status: "ok"}
		full, err := s.cli.Get(ctx, s.keys(ctx).StoreFull(), clientv3.WithCountOnly())
		if err != nil {
			b.Reasons = append(b.Reasons, "etcd: "+err.Error())
		} else {
			b.StoreFull = full.Count > 0
		}
		if s.cfg.Ready != nil {
			if err := s.cfg.Ready(ctx); err != nil {
				b.Reasons = append(b.Reasons, err.Error())
			}
		}
		if len(b.Reasons) > 0 {
			b.Status = "unready"
			p := newProblem(http.StatusServiceUnavailable, "unready", "not ready: "+joinReasons(b.Reasons))
			return nil, p
		}
		return &healthOutput{Body: b}, nil
	})
}

func joinReasons(r []string) string { return strings.Join(r, "; ") }
