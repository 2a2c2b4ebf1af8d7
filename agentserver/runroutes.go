package agentserver

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const tagRuns = "Agent Server: runs"

// maxAfterSeconds bounds a run's after_seconds (a week).
const maxAfterSeconds = 7 * 24 * 3600

// runBody is a run's request, as the SDK sends it.
type runBody struct {
	AssistantID       string         `json:"assistant_id" minLength:"1" doc:"The assistant to run: its id, or a graph's name."`
	Input             any            `json:"input,omitempty" doc:"The graph's input."`
	Command           any            `json:"command,omitempty" doc:"A Command (resume, update, goto) instead of an input."`
	Config            map[string]any `json:"config,omitempty" doc:"The run's config, over the assistant's."`
	Context           any            `json:"context,omitempty" doc:"The run's context, over the assistant's."`
	Metadata          map[string]any `json:"metadata,omitempty"`
	StreamMode        any            `json:"stream_mode,omitempty" doc:"A stream mode or a list of them (values by default)."`
	StreamSubgraphs   bool           `json:"stream_subgraphs,omitempty"`
	StreamResumable   bool           `json:"stream_resumable,omitempty"`
	FeedbackKeys      []string       `json:"feedback_keys,omitempty"`
	InterruptBefore   any            `json:"interrupt_before,omitempty" doc:"\"*\" or the nodes to interrupt before."`
	InterruptAfter    any            `json:"interrupt_after,omitempty" doc:"\"*\" or the nodes to interrupt after."`
	Webhook           string         `json:"webhook,omitempty" doc:"Not served yet (501)."`
	Checkpoint        any            `json:"checkpoint,omitempty" doc:"The checkpoint to start from."`
	CheckpointID      string         `json:"checkpoint_id,omitempty" doc:"The checkpoint to start from, by id."`
	StrictResume      bool           `json:"strict_resume,omitempty"`
	MultitaskStrategy string         `json:"multitask_strategy,omitempty" enum:"reject,enqueue,interrupt,rollback" doc:"What to do when the thread has an active run: reject (409, the default), enqueue (wait for it to end), interrupt (stop it, keep its checkpoints), rollback (stop it and delete it with its checkpoints)."`
	OnCompletion      string         `json:"on_completion,omitempty" enum:"delete,keep" doc:"keep: a threadless run's thread is kept (what happens when it is not given); delete is not served yet (501)."`
	OnDisconnect      string         `json:"on_disconnect,omitempty" enum:"cancel,continue" doc:"continue: the run outlives its caller (what happens when it is not given); cancel is not served yet (501)."`
	AfterSeconds      float64        `json:"after_seconds,omitempty" doc:"Start the run this many seconds from now (a delayed queue task): it is pending until then."`
	IfNotExists       string         `json:"if_not_exists,omitempty" enum:"create,reject" doc:"When the thread does not exist: reject (404, the default) or create it."`
	CheckpointDuring  *bool          `json:"checkpoint_during,omitempty"`
	Durability        string         `json:"durability,omitempty" enum:"sync,async,exit"`
	LangsmithTracer   any            `json:"langsmith_tracer,omitempty" doc:"Ignored: drover sends no traces."`
}

type runOutput struct {
	Location string `header:"Content-Location" doc:"The run's path."`
	Body     Run
}

type threadRunInput struct {
	ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
	Body     runBody
}

type runPath struct {
	ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
	RunID    string `path:"run_id" doc:"The run's id, a UUID."`
}

func (p runPath) ids() (string, string, error) {
	th, err := threadID(p.ThreadID)
	if err != nil {
		return "", "", err
	}
	if !isUUID(p.RunID) {
		return "", "", badInput("path.run_id", p.RunID, "must be a UUID")
	}
	return th, strings.ToLower(p.RunID), nil
}

// startRun checks a run's request and creates it on thread ("" for a
// stateless run, which gets a thread of its own).
func (s *server) startRun(ctx context.Context, thread string, b runBody) (Run, error) {
	switch {
	case b.Webhook != "":
		return Run{}, notBuilt("body.webhook", "webhooks")
	case b.AfterSeconds < 0 || b.AfterSeconds > maxAfterSeconds:
		return Run{}, badInput("body.after_seconds", b.AfterSeconds, fmt.Sprintf("must be from 0 to %d seconds", maxAfterSeconds))
	case b.OnCompletion == "delete":
		return Run{}, notBuilt("body.on_completion", "deleting a run's thread on completion")
	case b.OnDisconnect == "cancel":
		return Run{}, notBuilt("body.on_disconnect", "cancelling a run on disconnect")
	case b.MultitaskStrategy != "" && !strategies[b.MultitaskStrategy]:
		return Run{}, badInput("body.multitask_strategy", b.MultitaskStrategy, "must be reject, enqueue, interrupt or rollback")
	case b.Input != nil && b.Command != nil:
		return Run{}, badInput("body.command", b.Command, "must not be given with body.input")
	}
	a, _, err := s.getAssistant(ctx, b.AssistantID)
	var se huma.StatusError
	if errors.As(err, &se) && se.GetStatus() == http.StatusNotFound { // LangGraph's words
		return Run{}, huma.NewError(http.StatusNotFound, fmt.Sprintf("No assistant found for %q. Make sure the assistant ID is for a valid assistant or a valid graph ID.", b.AssistantID))
	}
	if err != nil {
		return Run{}, err
	}
	now := s.now()
	temporary := thread == ""
	if temporary || b.IfNotExists == "create" {
		if thread == "" {
			thread = s.ids.next(now)
		}
		t := Thread{ThreadID: thread, CreatedAt: now, UpdatedAt: now, Status: "idle", Config: map[string]any{}, Interrupts: map[string]any{},
			Metadata: map[string]any{"graph_id": a.GraphID, "assistant_id": a.AssistantID}}
		if _, err := s.createThread(ctx, t, true); err != nil {
			return Run{}, err
		}
	}
	kwargs := map[string]any{"input": b.Input, "command": b.Command, "config": orEmpty(b.Config), "context": b.Context,
		"stream_mode": streamModes(b.StreamMode), "interrupt_before": b.InterruptBefore, "interrupt_after": b.InterruptAfter,
		"checkpoint": b.Checkpoint, "checkpoint_id": b.CheckpointID, "subgraphs": b.StreamSubgraphs, "resumable": b.StreamResumable,
		"temporary": temporary && b.OnCompletion != "keep", "durability": b.Durability}
	r := runRecord{Run: Run{RunID: s.ids.next(now), ThreadID: thread, AssistantID: a.AssistantID, CreatedAt: now, UpdatedAt: now,
		Status: "pending", Metadata: orEmpty(b.Metadata), Kwargs: kwargs, MultitaskStrategy: cmp.Or(b.MultitaskStrategy, "reject")}, GraphID: a.GraphID}
	return s.createRun(ctx, r, a, temporary, time.Duration(b.AfterSeconds*float64(time.Second)))
}

// streamModes is a run's stream modes as a list (values by default).
func streamModes(v any) []any {
	switch m := v.(type) {
	case string:
		return []any{m}
	case []any:
		if len(m) > 0 {
			return m
		}
	}
	return []any{"values"}
}

// finalValues is what join and wait answer: the thread's values after
// the run, or {__error__} when it failed.
func (s *server) finalValues(ctx context.Context, r runRecord) (any, error) {
	if r.Status == "error" {
		return map[string]any{"__error__": r.Error}, nil
	}
	st, err := s.threadState(ctx, r.ThreadID)
	if err != nil {
		return nil, err
	}
	return st.State.Values, nil
}

func (s *server) runRoutes(api huma.API) {
	tags := []string{tagRuns}
	create := func(ctx context.Context, thread string, b runBody) (*runOutput, error) {
		r, err := s.startRun(ctx, thread, b)
		if err != nil {
			return nil, err
		}
		return &runOutput{Location: "/threads/" + r.ThreadID + "/runs/" + r.RunID, Body: r}, nil
	}
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-run", Method: http.MethodPost, Path: "/threads/{thread_id}/runs", Tags: tags,
		Summary:     "Create a background run (LangGraph)",
		Description: "A queue task of queue " + RunsQueue + " that a runtime claims. 409 when the thread has an active run.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusNotImplemented},
	}, func(ctx context.Context, in *threadRunInput) (*runOutput, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		return create(ctx, id, in.Body)
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-create-stateless-run", Method: http.MethodPost, Path: "/runs", Tags: tags,
		Summary: "Create a background run on a thread of its own (LangGraph)",
		Errors:  []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct{ Body runBody }) (*runOutput, error) {
		return create(ctx, "", in.Body)
	})
	wait := func(ctx context.Context, thread string, b runBody) (*huma.StreamResponse, error) {
		r, err := s.startRun(ctx, thread, b)
		if err != nil {
			return nil, err
		}
		ans, loc := s.joinAnswer(r.ThreadID, r.RunID, true), "/threads/"+r.ThreadID+"/runs/"+r.RunID
		body := ans.Body // the SDK's onRunCreated reads the run from Content-Location
		ans.Body = func(hctx huma.Context) { hctx.SetHeader("Content-Location", loc); body(hctx) }
		return ans, nil
	}
	huma.Register(api, huma.Operation{
		OperationID: "lg-wait-run", Method: http.MethodPost, Path: "/threads/{thread_id}/runs/wait", Tags: tags,
		Summary: "Create a run and wait for its values (LangGraph)",
		Errors:  []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusNotImplemented},
	}, func(ctx context.Context, in *threadRunInput) (*huma.StreamResponse, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		return wait(ctx, id, in.Body)
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-wait-stateless-run", Method: http.MethodPost, Path: "/runs/wait", Tags: tags,
		Summary: "Create a run on a thread of its own and wait for its values (LangGraph)",
		Errors:  []int{http.StatusBadRequest, http.StatusNotFound, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct{ Body runBody }) (*huma.StreamResponse, error) {
		return wait(ctx, "", in.Body)
	})
	s.runReadRoutes(api, tags)
	s.runManyRoutes(api, tags)
	s.runStreamRoutes(api)
}

// joinAnswer answers, once run id ends, the thread's values (or the
// run's error), however long the run takes; checked as waitRun's.
func (s *server) joinAnswer(thread, id string, checked bool) *huma.StreamResponse {
	return longAnswer(func(ctx context.Context) (any, error) {
		r, err := s.waitRun(ctx, thread, id, checked)
		if err != nil {
			return nil, err
		}
		return s.finalValues(ctx, r)
	})
}

func (s *server) runReadRoutes(api huma.API, tags []string) {
	huma.Register(api, huma.Operation{
		OperationID: "lg-list-runs", Method: http.MethodGet, Path: "/threads/{thread_id}/runs", Tags: tags,
		Summary: "A thread's runs, newest first (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID string   `path:"thread_id" doc:"The thread's id, a UUID."`
		Limit    int      `query:"limit" minimum:"1" maximum:"1000" default:"10"`
		Offset   int      `query:"offset" minimum:"0"`
		Status   string   `query:"status" enum:"pending,running,error,success,timeout,interrupted"`
		Select   []string `query:"select" doc:"Only these fields of each run."`
	}) (*struct{ Body []any }, error) {
		id, err := threadID(in.ThreadID)
		if err != nil {
			return nil, err
		}
		if _, _, err := s.getThread(ctx, id); err != nil {
			return nil, err
		}
		runs, err := s.listRuns(ctx, id)
		if err != nil {
			return nil, err
		}
		var match []Run
		for _, r := range runs {
			if in.Status == "" || r.Status == in.Status {
				match = append(match, r.Run)
			}
		}
		lo, hi, _, _ := page(len(match), in.Offset, in.Limit)
		out := []any{}
		for _, r := range match[lo:hi] {
			v, err := selectFields(r, in.Select)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return &struct{ Body []any }{Body: out}, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-get-run", Method: http.MethodGet, Path: "/threads/{thread_id}/runs/{run_id}", Tags: tags,
		Summary: "A run (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *runPath) (*struct{ Body Run }, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		r, _, err := s.getRun(ctx, th, id)
		if err == nil && r.Queued && !r.Ended { // its turn may have come with nobody to start it
			if err := s.admitNext(ctx, th); err != nil {
				return nil, err
			}
			r, _, err = s.getRun(ctx, th, id)
		}
		return &struct{ Body Run }{Body: r.Run}, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-join-run", Method: http.MethodGet, Path: "/threads/{thread_id}/runs/{run_id}/join", Tags: tags,
		Summary: "Wait for a run and answer the thread's values (LangGraph)", Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *struct {
		ThreadID           string `path:"thread_id" doc:"The thread's id, a UUID."`
		RunID              string `path:"run_id" doc:"The run's id, a UUID."`
		CancelOnDisconnect string `query:"cancel_on_disconnect" doc:"Ignored: a run outlives its waiters."`
	}) (*huma.StreamResponse, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		if _, _, err := s.getRun(ctx, th, id); err != nil {
			return nil, err
		}
		return s.joinAnswer(th, id, true), nil // its task read by getRun
	})
	s.runChangeRoutes(api, tags)
}

func (s *server) runChangeRoutes(api huma.API, tags []string) {
	huma.Register(api, huma.Operation{
		OperationID: "lg-cancel-run", Method: http.MethodPost, Path: "/threads/{thread_id}/runs/{run_id}/cancel", Tags: tags,
		Summary:     "Cancel a run (LangGraph)",
		Description: "Cancels its queue task (a runtime running it has its claim taken away) and takes the thread's lock from it (its late checkpoint writes are refused). The run ends interrupted, or with action=rollback is deleted with its checkpoints. The thread's next enqueued run then starts.",
		Errors:      []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusNotImplemented},
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		RunID    string `path:"run_id" doc:"The run's id, a UUID."`
		Wait     string `query:"wait" doc:"1: answer once the run has ended."`
		Action   string `query:"action" enum:"interrupt,rollback" doc:"interrupt (the default): the run ends interrupted, its checkpoints kept; rollback: the run is deleted with its checkpoints."`
		Reason   string `query:"reason"`
	}) (*struct{}, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		if err := s.cancelRun(ctx, th, id, in.Action == "rollback"); err != nil {
			return nil, err
		}
		if in.Action != "rollback" && (in.Wait == "1" || in.Wait == "true") {
			_, err = s.waitRun(ctx, th, id, false)
		}
		return nil, err
	})
	huma.Register(api, huma.Operation{
		OperationID: "lg-delete-run", Method: http.MethodDelete, Path: "/threads/{thread_id}/runs/{run_id}", Tags: tags,
		Summary: "Delete a run that has ended (LangGraph)", DefaultStatus: http.StatusNoContent,
		Errors: []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict},
	}, func(ctx context.Context, in *runPath) (*struct{}, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		r, _, err := s.getRun(ctx, th, id)
		if err != nil {
			return nil, err
		}
		if r.Status == "pending" || r.Status == "running" {
			return nil, huma.NewError(http.StatusConflict, "the run is "+r.Status+": cancel it first")
		}
		sp, err := s.space(ctx)
		if err != nil {
			return nil, err
		}
		if _, err := s.cfg.Etcd.Txn(ctx).Then(clientv3.OpDelete(sp.AgentRun(th, id)), clientv3.OpDelete(sp.AgentActiveRun(th, id))).Commit(); err != nil {
			return nil, etcdError("deleting the run", err)
		}
		return nil, nil
	})
	huma.Register(api, huma.Operation{
		OperationID: "agent-server-end-run", Method: http.MethodPut, Path: "/v1/agent-server/threads/{thread_id}/runs/{run_id}/outcome", Tags: tags,
		Summary:      "Record how a run ended (for runtimes)",
		Description:  "The runtime that holds the run's queue task (under the claim's token) reports its status and the thread's state; the run and the thread are written in one transaction. 409 when the runtime no longer holds the task. The history is kept newest first, one key per state, at most 100 states, and as many of the states sent as fit 1 MiB beside the state and the thread's values; with history_append the runtime sends only the run's new states and the server keeps the stored ones after them (412 when they do not join).",
		Errors:       []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusPreconditionFailed, http.StatusRequestEntityTooLarge},
		MaxBodyBytes: maxOutcomeBody, BodyReadTimeout: 2 * time.Minute,
	}, func(ctx context.Context, in *struct {
		ThreadID string `path:"thread_id" doc:"The thread's id, a UUID."`
		RunID    string `path:"run_id" doc:"The run's id, a UUID."`
		Body     runOutcome
	}) (*struct{ Body Run }, error) {
		th, id, err := runPath{in.ThreadID, in.RunID}.ids()
		if err != nil {
			return nil, err
		}
		r, err := s.endRun(ctx, th, id, in.Body)
		return &struct{ Body Run }{Body: r}, err
	})
	s.runStartRoute(api, tags)
	s.stateRoutes(api)
}

func isFinished(err error) bool {
	return errors.Is(err, queue.ErrFinished) || errors.Is(err, queue.ErrNotFound)
}
