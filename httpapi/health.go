package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
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
		Summary: "Readiness: etcd answers and the store is not full",
		Description: "503 when etcd does not answer within 2 s, etcd's NOSPACE alarm is raised (every write that adds data is refused, " +
			"lease grants included: the problem says store_full true), or the server's own check fails. A store past its high-water " +
			"mark is still ready (locks and leases work) and says store_full.",
		Metadata: map[string]any{"public": true},
		Errors:   []int{http.StatusServiceUnavailable},
	}, func(ctx context.Context, _ *struct{}) (*healthOutput, error) {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		b := HealthBody{Status: "ok"}
		full, err := s.cli.Get(ctx, s.keys(ctx).StoreFull(), clientv3.WithCountOnly())
		if err != nil {
			b.Reasons = append(b.Reasons, "etcd: "+err.Error())
		} else {
			b.StoreFull = full.Count > 0
			if reason := s.noSpace(ctx); reason != "" {
				b.StoreFull = true
				b.Reasons = append(b.Reasons, reason)
			}
		}
		if s.cfg.Ready != nil {
			if err := s.cfg.Ready(ctx); err != nil {
				b.Reasons = append(b.Reasons, err.Error())
			}
		}
		if len(b.Reasons) > 0 {
			return nil, &unready{Problem: newProblem(http.StatusServiceUnavailable, "unready", "not ready: "+joinReasons(b.Reasons)),
				Reasons: b.Reasons, StoreFull: b.StoreFull}
		}
		return &healthOutput{Body: b}, nil
	})
}

// unready is /readyz's 503: a problem document that also says whether
// the store is full.
type unready struct {
	*Problem
	Reasons   []string `json:"reasons"`
	StoreFull bool     `json:"store_full"`
}

// noSpace says why the server is not ready when etcd's NOSPACE alarm is
// raised (by any member: it stops writes on all of them), "" when it is
// not. The alarm list is etcd's own (what `etcdctl endpoint health`
// asks), not the store guard's last reading. An etcd that lets this client
// list no alarms (authentication without the right) is taken at its word
// by the guard key alone; any other failure is a reason.
func (s *Server) noSpace(ctx context.Context) string {
	al, err := s.cli.AlarmList(ctx)
	switch {
	case errors.Is(err, rpctypes.ErrPermissionDenied), errors.Is(err, rpctypes.ErrUserEmpty):
		return ""
	case err != nil:
		return "etcd: list alarms: " + err.Error()
	}
	for _, a := range al.Alarms {
		if a.Alarm == pb.AlarmType_NOSPACE {
			return fmt.Sprintf("etcd's NOSPACE alarm is raised (member %x): every write that adds data is refused, lease grants and locks included; "+
				"delete data (`drover tasks purge`, `drover dlq purge`): the store guard compacts, defragments and disarms it once usage is under the low-water mark", a.MemberID)
		}
	}
	return ""
}

func joinReasons(r []string) string { return strings.Join(r, "; ") }
