package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/flow"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// QuotaBody is a concurrency quota: its limits and the slots held now.
type QuotaBody struct {
	Name     string         `json:"name" doc:"The quota's name: tenant (per tenant), type (per task type) or a shared resource."`
	Limit    int            `json:"limit" doc:"The limit of every subject without one of its own (0: none)."`
	Subjects map[string]int `json:"subjects,omitempty" doc:"Limits of their own, by tenant or task type."`
	Held     map[string]int `json:"held" doc:"Slots held now (by workers and sessions), by subject; '-' for a shared resource."`
}

func quotaBodyOf(q flow.QuotaUsage) QuotaBody {
	return QuotaBody{Name: q.Name, Limit: q.Limit, Subjects: q.Subjects, Held: q.Held}
}

// SlotBody is a quota slot taken or given back under a session.
type SlotBody struct {
	Name    string `json:"name" doc:"The quota's name."`
	Subject string `json:"subject" doc:"The tenant or task type counted; '-' for a shared resource."`
	Session string `json:"session" doc:"The session holding the slots: they are freed when it ends."`
	Held    int    `json:"held" doc:"Slots of the subject the session holds now."`
	InUse   int    `json:"in_use" doc:"Slots of the subject the whole fleet holds now."`
	Limit   int    `json:"limit" doc:"The subject's limit (0: none)."`
}

type quotaPath struct {
	Name string `path:"name" doc:"The quota's name: tenant, type, or a shared resource's name."`
}

type setQuotaInput struct {
	Name string `path:"name" doc:"The quota's name: tenant, type, or a shared resource's name."`
	Body struct {
		Limit   int    `json:"limit" doc:"At most this many at once, 1 to 100000; 0 with a subject removes the subject's own limit."`
		Subject string `json:"subject,omitempty" maxLength:"128" doc:"One tenant or task type to give a limit of its own; omitted: every subject's limit."`
	}
}

type slotInput struct {
	Name string `path:"name" doc:"The quota's name."`
	Body struct {
		Session string `json:"session" doc:"The session to hold the slot under: it is freed when the session ends (no keepalive within its TTL)."`
		Subject string `json:"subject,omitempty" doc:"The tenant (quota tenant) or task type (quota type); omitted for a shared resource."`
		Wait    string `json:"wait,omitempty" doc:"Acquire only: how long to wait for a free slot (Go duration, capped by the server's longest wait); without it one attempt is made."`
	}
}

type slotOutput struct{ Body SlotBody }

type quotaOutput struct{ Body QuotaBody }

// slotWhere maps the flow package's input names to the request's.
var slotWhere = map[string]string{"subject": "body.subject", "limit": "body.limit"}

func (s *Server) quotaRoutes() {
	tags := []string{"flow control"}
	huma.Register(s.api, huma.Operation{
		OperationID: "list-quotas", Method: http.MethodGet, Path: "/v1/quotas", Tags: tags,
		Summary: "Every concurrency quota, with the slots held now",
	}, func(ctx context.Context, _ *struct{}) (*struct{ Body []QuotaBody }, error) {
		qs, err := flow.Quotas(ctx, s.cli, s.nsOf(ctx))
		if err != nil {
			return nil, problem(err, nil)
		}
		out := make([]QuotaBody, len(qs))
		for i, q := range qs {
			out[i] = quotaBodyOf(q)
		}
		return &struct{ Body []QuotaBody }{out}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "get-quota", Method: http.MethodGet, Path: "/v1/quotas/{name}", Tags: tags,
		Summary: "A concurrency quota, with the slots held now", Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *quotaPath) (*quotaOutput, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		q, err := flow.QuotaOf(ctx, s.cli, s.nsOf(ctx), in.Name)
		if err != nil {
			return nil, problem(err, nil)
		}
		return &quotaOutput{quotaBodyOf(q)}, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "set-quota", Method: http.MethodPut, Path: "/v1/quotas/{name}", Tags: tags,
		Summary:     "Set (or create) a quota's limit, for every subject or one",
		Description: "As `drover quotas set`; every worker follows within a second. Lowering a limit stops nothing that runs. Needs the admin role.",
		Metadata:    adminRole,
	}, s.setQuota)
	huma.Register(s.api, huma.Operation{
		OperationID: "delete-quota", Method: http.MethodDelete, Path: "/v1/quotas/{name}", Tags: tags,
		Summary: "Delete a quota: its limits, grants and ledgers", Description: "Needs the admin role; 404 when it is not configured.",
		Metadata: adminRole, DefaultStatus: http.StatusNoContent, Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *quotaPath) (*struct{}, error) {
		if err := checkKeyName("path.name", in.Name); err != nil {
			return nil, err
		}
		if err := flow.DeleteQuota(ctx, s.cli, s.nsOf(ctx), in.Name); err != nil {
			return nil, problem(err, nil)
		}
		return nil, nil
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "acquire-slot", Method: http.MethodPost, Path: "/v1/quotas/{name}/acquire", Tags: tags,
		Summary: "Take a quota slot under a session",
		Description: "Takes one slot of the subject, counted with the slots workers hold, bound to the session: release it when done, or it is " +
			"freed when the session ends. 429 with Retry-After when every slot is held (after wait, if given).",
		Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusTooManyRequests},
	}, s.acquireSlot)
	huma.Register(s.api, huma.Operation{
		OperationID: "release-slot", Method: http.MethodPost, Path: "/v1/quotas/{name}/release", Tags: tags,
		Summary: "Give back a quota slot held under a session",
		Errors:  []int{http.StatusNotFound, http.StatusConflict},
	}, s.releaseSlot)
}

func (s *Server) setQuota(ctx context.Context, in *setQuotaInput) (*quotaOutput, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	b := in.Body
	if strings.Contains(b.Subject, "/") {
		return nil, invalid("body.subject", b.Subject, "must not contain '/'")
	}
	if b.Limit != 0 || b.Subject == "" {
		if err := flow.CheckQuotaLimit("body.limit", b.Limit); err != nil {
			return nil, problem(err, nil)
		}
	}
	ns := s.nsOf(ctx)
	if err := flow.SetQuota(ctx, s.cli, ns, in.Name, b.Subject, b.Limit); err != nil {
		return nil, problem(err, slotWhere)
	}
	q, err := flow.QuotaOf(ctx, s.cli, ns, in.Name)
	if err != nil {
		return nil, problem(err, nil)
	}
	return &quotaOutput{quotaBodyOf(q)}, nil
}

func (s *Server) acquireSlot(ctx context.Context, in *slotInput) (*slotOutput, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	b := in.Body
	if _, err := flow.SlotSubject(in.Name, b.Subject); err != nil {
		return nil, problem(err, slotWhere)
	}
	wait, err := s.wait("body.wait", b.Wait)
	if err != nil {
		return nil, err
	}
	sess, err := s.session(ctx, "body.session", b.Session)
	if err != nil {
		return nil, err
	}
	ns := s.nsOf(ctx)
	deadline := time.Now().Add(wait)
	for {
		res, err := flow.AcquireSlot(ctx, s.cli, ns, in.Name, b.Subject, sess.id)
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return nil, sessionGone(b.Session, ns)
		}
		if err != nil {
			return nil, problem(err, slotWhere)
		}
		if res.Granted {
			return &slotOutput{slotBodyOf(in.Name, b.Session, res)}, nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			p := newProblem(http.StatusTooManyRequests, "quota-full",
				fmt.Sprintf("quota %s: all %d slots of %s are held; nothing was taken; retry later, or wait longer (wait)", in.Name, res.Limit, res.Subject))
			p.headers = http.Header{"Retry-After": {"1"}}
			return nil, p
		}
		s.awaitChange(ctx, s.keys(ctx).Quota(in.Name), res.Revision, left)
	}
}

// awaitChange waits until a key under prefix changes after revision rev,
// for at most d.
func (s *Server) awaitChange(ctx context.Context, prefix string, rev int64, d time.Duration) {
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	wch := s.cli.Watch(clientv3.WithRequireLeader(wctx), prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	select {
	case <-wch:
	case <-wctx.Done():
	}
}

func (s *Server) releaseSlot(ctx context.Context, in *slotInput) (*slotOutput, error) {
	if err := checkKeyName("path.name", in.Name); err != nil {
		return nil, err
	}
	b := in.Body
	if b.Wait != "" {
		return nil, invalid("body.wait", b.Wait, "applies to acquire only")
	}
	if _, err := flow.SlotSubject(in.Name, b.Subject); err != nil {
		return nil, problem(err, slotWhere)
	}
	sess, err := s.session(ctx, "body.session", b.Session)
	if err != nil {
		return nil, err
	}
	res, err := flow.ReleaseSlot(ctx, s.cli, s.nsOf(ctx), in.Name, b.Subject, sess.id)
	if errors.Is(err, flow.ErrNoSlot) {
		return nil, newProblem(http.StatusConflict, "no-slot", err.Error()+": the session holds no slot of it (released already, or never acquired)")
	}
	if err != nil {
		return nil, problem(err, slotWhere)
	}
	return &slotOutput{slotBodyOf(in.Name, b.Session, res)}, nil
}

func slotBodyOf(name, session string, r flow.SlotResult) SlotBody {
	return SlotBody{Name: name, Subject: r.Subject, Session: session, Held: r.Held, InUse: r.InUse, Limit: r.Limit}
}
