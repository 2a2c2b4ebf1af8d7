package agentserver

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"github.com/danielgtaylor/huma/v2"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// cancelRun stops run id of thread: its task cancelled and the thread's
// lock taken from its runtime (unless a later run holds the thread), its
// record written ended interrupted; with rollback its checkpoints and its
// record are deleted. Then the thread's next enqueued run is admitted. A
// run that has ended stays as it ended (rollback deletes it).
func (s *server) cancelRun(ctx context.Context, thread, id string, rollback bool) error {
	r, _, err := s.getRun(ctx, thread, id)
	if err != nil {
		return err
	}
	if !r.Ended {
		if err := s.stopRuns(ctx, thread, []runRecord{r}, rollback, ""); err != nil && !errors.Is(err, errMoved) {
			return err
		}
		// errMoved: another run was admitted, so this one had ended.
		r, rev, err := s.getRun(ctx, thread, id) // a cancelled task's run is settled by the read
		if err != nil {
			return err
		}
		if !r.Ended { // queued, or its task is gone
			r.Status, r.Error = "interrupted", nil
			if _, err := s.settle(ctx, &r, rev); err != nil {
				return err
			}
		}
	}
	if rollback {
		sp, err := s.space(ctx)
		if err != nil {
			return err
		}
		if _, err := s.cfg.Etcd.Txn(ctx).Then(clientv3.OpDelete(sp.AgentRun(thread, id)), clientv3.OpDelete(sp.AgentActiveRun(thread, id))).Commit(); err != nil {
			return etcdError("deleting the run", err)
		}
	}
	return s.admitNext(ctx, thread)
}

// cancelManyBody is what POST /runs/cancel takes, as the SDK's
// cancelMany sends it.
type cancelManyBody struct {
	ThreadID string   `json:"thread_id,omitempty" doc:"The thread whose runs to cancel."`
	RunIDs   []string `json:"run_ids,omitempty" maxItems:"1000" doc:"The runs to cancel (of thread_id, or found by id)."`
	Status   string   `json:"status,omitempty" enum:"pending,running,all" doc:"Instead of run_ids: every run with this status (of thread_id, or of the namespace)."`
}

// runRef names a run with its thread.
type runRef struct{ thread, id string }

// runsToCancel resolves a cancel-many request to the runs it names.
func (s *server) runsToCancel(ctx context.Context, b cancelManyBody) ([]runRef, error) {
	switch {
	case len(b.RunIDs) > 0 && b.Status != "":
		return nil, badInput("body.status", b.Status, "must not be given with body.run_ids")
	case len(b.RunIDs) == 0 && b.Status == "":
		return nil, badInput("body.run_ids", nil, "give run_ids, or status (pending, running or all)")
	}
	thread := ""
	if b.ThreadID != "" {
		th, err := threadID(b.ThreadID)
		if err != nil {
			return nil, err
		}
		if _, _, err := s.getThread(ctx, th); err != nil {
			return nil, err
		}
		thread = th
	}
	all, err := s.runKeys(ctx, thread)
	if err != nil {
		return nil, err
	}
	if len(b.RunIDs) > 0 {
		byID := map[string]runRef{}
		for _, r := range all {
			byID[r.id] = r
		}
		out := make([]runRef, 0, len(b.RunIDs))
		for i, id := range b.RunIDs {
			if !isUUID(id) {
				return nil, badInput("body.run_ids["+itoa(i)+"]", id, "must be a UUID")
			}
			r, ok := byID[strings.ToLower(id)]
			if !ok {
				return nil, errRunNotFound(id)
			}
			out = append(out, r)
		}
		return out, nil
	}
	var out []runRef
	for _, ref := range all {
		r, _, err := s.getRun(ctx, ref.thread, ref.id)
		if isNotFound(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if r.Status == b.Status || b.Status == "all" && (r.Status == "pending" || r.Status == "running") {
			out = append(out, ref)
		}
	}
	return out, nil
}

// runKeys lists the runs of thread ("": of every thread of the
// namespace) by their keys.
func (s *server) runKeys(ctx context.Context, thread string) ([]runRef, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	prefix := sp.AgentRuns(thread)
	resp, err := s.cfg.Etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, etcdError("listing runs", err)
	}
	root := sp.AgentRuns("")
	out := make([]runRef, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		th, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
		if ok {
			out = append(out, runRef{th, id})
		}
	}
	return out, nil
}

func (s *server) runManyRoutes(api huma.API, tags []string) {
	huma.Register(api, huma.Operation{
		OperationID: "lg-cancel-runs", Method: http.MethodPost, Path: "/runs/cancel", Tags: tags,
		Summary:       "Cancel several runs (LangGraph)",
		Description:   "The runs run_ids names (of thread_id, or found by id), or every run with status (of thread_id, or of the namespace), each cancelled as one run's cancel does.",
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *struct {
		Action string `query:"action" enum:"interrupt,rollback" doc:"interrupt (the default) or rollback, as one run's cancel."`
		Body   cancelManyBody
	}) (*struct{}, error) {
		refs, err := s.runsToCancel(ctx, in.Body)
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			if err := s.cancelRun(ctx, r.thread, r.id, in.Action == "rollback"); err != nil && !isNotFound(err) {
				return nil, err
			}
		}
		return nil, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-runs-batch", Method: http.MethodPost, Path: "/runs/batch", Tags: tags,
		Summary:     "Create background runs, each on a thread of its own (LangGraph)",
		Description: "Each item is a run's request as POST /runs takes it; the runs are created in order, and the first refused ends the batch with its error (the runs before it stay).",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct {
		Body []runBody `maxItems:"100" minItems:"1"`
	}) (*struct{ Body []Run }, error) {
		out := make([]Run, 0, len(in.Body))
		for i, b := range in.Body {
			r, err := s.startRun(ctx, "", b)
			if err != nil {
				var se huma.StatusError
				if errors.As(err, &se) {
					return nil, huma.NewError(se.GetStatus(), "body["+itoa(i)+"]: "+se.Error())
				}
				return nil, err
			}
			out = append(out, r)
		}
		return &struct{ Body []Run }{Body: out}, nil
	})
}
