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
	if len(b.RunIDs) > 0 {
		want := map[string]bool{}
		for i, id := range b.RunIDs {
			if !isUUID(id) {
				return nil, badInput("body.run_ids["+itoa(i)+"]", id, "must be a UUID")
			}
			want[strings.ToLower(id)] = true
		}
		found, err := s.findRuns(ctx, thread, want)
		if err != nil {
			return nil, err
		}
		out := make([]runRef, 0, len(b.RunIDs))
		for _, id := range b.RunIDs {
			r, ok := found[strings.ToLower(id)]
			if !ok {
				return nil, errRunNotFound(id)
			}
			out = append(out, r)
		}
		return out, nil
	}
	// A run pending or running has not ended: it is in the index of
	// active runs, read a page at a time, never the runs' history.
	var out []runRef
	err := s.activeRefs(ctx, thread, func(refs []runRef) error {
		for _, ref := range refs {
			r, _, err := s.getRun(ctx, ref.thread, ref.id)
			if isNotFound(err) {
				continue
			}
			if err != nil {
				return err
			}
			if r.Status == b.Status || b.Status == "all" && (r.Status == "pending" || r.Status == "running") {
				out = append(out, ref)
			}
		}
		return nil
	})
	return out, err
}

// runPage is how many keys one read of a run lookup answers: the index
// of active runs and the runs' keys are read a page at a time.
const runPage = 1000

// activeRefs calls page with the runs of thread ("": of every thread of
// the namespace) in the index of active runs, a page at a time, until
// the index ends or page fails.
func (s *server) activeRefs(ctx context.Context, thread string, page func([]runRef) error) error {
	sp, err := s.space(ctx)
	if err != nil {
		return err
	}
	if err := s.ensureRunIndex(ctx, sp); err != nil {
		return err
	}
	return s.scanRefs(ctx, sp.AgentActiveRuns(thread), sp.AgentActiveRuns(""), page)
}

// scanRefs calls page with the runs whose keys are under prefix (keys
// root/{thread}/{run}), runPage keys a read, in key order: each read
// starts after the last key of the one before, so the loop ends with the
// range.
func (s *server) scanRefs(ctx context.Context, prefix, root string, page func([]runRef) error) error {
	from, end := prefix, clientv3.GetPrefixRangeEnd(prefix)
	for {
		resp, err := s.cfg.Etcd.Get(ctx, from, clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(runPage))
		if err != nil {
			return etcdError("listing runs", err)
		}
		refs := make([]runRef, 0, len(resp.Kvs))
		for _, kv := range resp.Kvs {
			th, id, ok := strings.Cut(strings.TrimPrefix(string(kv.Key), root), "/")
			if ok {
				refs = append(refs, runRef{th, id})
			}
		}
		if err := page(refs); err != nil {
			return err
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// errFound ends a scan that found what it looked for.
var errFound = errors.New("agentserver: found")

// findRuns finds the threads of the runs want names: of thread, by
// their keys; else in the index of active runs first, then in the runs'
// keys, a page at a time, until every one is found or the keys end. A
// run not found is left out of the answer.
func (s *server) findRuns(ctx context.Context, thread string, want map[string]bool) (map[string]runRef, error) {
	sp, err := s.space(ctx)
	if err != nil {
		return nil, err
	}
	found := map[string]runRef{}
	if thread != "" {
		var gets []clientv3.Op
		for id := range want {
			gets = append(gets, clientv3.OpGet(sp.AgentRun(thread, id), clientv3.WithKeysOnly()))
		}
		for len(gets) > 0 {
			n := min(len(gets), maxTxnOps)
			resp, err := s.cfg.Etcd.Txn(ctx).Then(gets[:n]...).Commit()
			if err != nil {
				return nil, etcdError("reading runs", err)
			}
			for _, r := range resp.Responses {
				for _, kv := range r.GetResponseRange().Kvs {
					found[idOf(kv.Key)] = runRef{thread, idOf(kv.Key)}
				}
			}
			gets = gets[n:]
		}
		return found, nil
	}
	collect := func(refs []runRef) error {
		for _, r := range refs {
			if want[r.id] {
				found[r.id] = r
			}
		}
		if len(found) == len(want) {
			return errFound
		}
		return nil
	}
	if err := s.activeRefs(ctx, "", collect); err != nil && !errors.Is(err, errFound) {
		return nil, err
	} else if err == nil {
		err = s.scanRefs(ctx, sp.AgentRuns(""), sp.AgentRuns(""), collect)
		if err != nil && !errors.Is(err, errFound) {
			return nil, err
		}
	}
	return found, nil
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
