package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// queuePath names a queue in a route's path.
type queuePath struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
}

// queueTaskPath names a task of a queue.
type queueTaskPath struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	ID    string `path:"id" minLength:"1" maxLength:"128" doc:"The task's id."`
}

// queueWhere maps the queue package's input fields to the API's locations.
var queueWhere = map[string]string{"queue": "path.queue", "task id": "path.id", "limit": "query.limit", "after": "query.after",
	"status": "query.status", "max": "body.max", "token": "body.token", "result": "body.result"}

type claimInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Body  struct {
		Session string `json:"session" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session the claims are bound to: when it ends, etcd frees them and the tasks run again elsewhere."`
		Max     int    `json:"max,omitempty" minimum:"1" maximum:"100" doc:"The most tasks to claim; default 1."`
		Wait    string `json:"wait,omitempty" doc:"How long to wait for a task when none is claimable (Go duration: 10s, 500ms), capped by the server's longest wait; without it one attempt is made."`
	}
}

// ClaimResult is the answer to a claim.
type ClaimResult struct {
	Tasks []QueueTask `json:"tasks" doc:"The tasks claimed, RUNNING, each with its attempt and token; empty when none came within the wait."`
}

type heartbeatInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	ID    string `path:"id" minLength:"1" maxLength:"128" doc:"The task's id."`
	Body  struct {
		Session string `json:"session" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session the task was claimed under."`
		Token   int64  `json:"token" minimum:"1" doc:"The token the claim returned with the task."`
	}
}

// HeartbeatResult is the answer to a heartbeat.
type HeartbeatResult struct {
	TaskID    string    `json:"task_id" doc:"The task."`
	Attempt   int       `json:"attempt" doc:"The attempt that runs."`
	Token     int64     `json:"token" doc:"The claim's token."`
	ExpiresAt time.Time `json:"expires_at" doc:"When the session, and with it the claim, ends unless kept alive (the heartbeat renewed it)."`
}

type ackInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	ID    string `path:"id" minLength:"1" maxLength:"128" doc:"The task's id."`
	Body  struct {
		Session string          `json:"session" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session the task was claimed under."`
		Token   int64           `json:"token" minimum:"1" doc:"The token the claim returned with the task."`
		Result  json.RawMessage `json:"result,omitempty" doc:"The task's result: any JSON value, at most 256 KiB."`
		// Defer hands the task back unrun instead, as the batch route's does.
		Defer *OutcomeDefer `json:"defer,omitempty" doc:"Instead of a success (then without result, or with a null one): the task was not run and waits, as defer does in POST /v1/queues/{queue}/outcomes: PENDING again, its attempt not counted, claimable after after; a reason budget KEY: why (KEY the task's metadata.budget) makes tasks get show budget_wait."`
	}
}

type failInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	ID    string `path:"id" minLength:"1" maxLength:"128" doc:"The task's id."`
	Body  struct {
		Session   string `json:"session" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session the task was claimed under."`
		Token     int64  `json:"token" minimum:"1" doc:"The token the claim returned with the task."`
		Error     string `json:"error,omitempty" maxLength:"65536" doc:"What went wrong: kept in the task's history (the first 4 KiB). Required unless defer."`
		Permanent bool   `json:"permanent,omitempty" doc:"True when retrying cannot help: the task goes to the dead-letter queue at once. Otherwise it is retried after the queue's backoff while its retry budget lasts."`
		// Defer hands the task back unrun instead, as the batch route's does.
		Defer *OutcomeDefer `json:"defer,omitempty" doc:"Instead of a failure (then without error and permanent): the task was not run and waits, as defer does in POST /v1/queues/{queue}/outcomes: PENDING again, its attempt not counted, claimable after after; a reason budget KEY: why (KEY the task's metadata.budget) makes tasks get show budget_wait."`
	}
}

type queueTaskOutput struct{ Body QueueTask }

func (s *Server) queueRoutes() {
	tags := []string{"queues"}
	s.submitRoute()
	huma.Register(s.api, huma.Operation{
		OperationID: "claim-tasks", Method: http.MethodPost, Path: "/v1/queues/{queue}/claim", Tags: tags,
		Summary: "Claim tasks, waiting for them (long poll)",
		Description: "Claims up to max tasks for the session, as a Go worker does: each claim is bound to the session's lease and " +
			"fenced by its token, attempts are counted durably. With wait, the request waits for tasks (it watches the queue) " +
			"and answers as soon as one is claimed, or with no tasks once the wait ran out. Keep the session alive while the " +
			"tasks run; if it expires their claims go and the tasks run again elsewhere. Report each with ack or fail.",
		Errors: []int{http.StatusNotFound},
	}, s.claimTasks)
	huma.Register(s.api, huma.Operation{
		OperationID: "heartbeat-task", Method: http.MethodPost, Path: "/v1/queues/{queue}/tasks/{id}/heartbeat", Tags: tags,
		Summary:     "Check that a claim still holds, and keep its session alive",
		Description: "409 when the claim is gone (the session expired, the task was cancelled, or its outcome was written): stop working on the task.",
		Errors:      []int{http.StatusConflict, http.StatusNotFound},
	}, s.heartbeatTask)
	huma.Register(s.api, huma.Operation{
		OperationID: "ack-task", Method: http.MethodPost, Path: "/v1/queues/{queue}/tasks/{id}/ack", Tags: tags,
		Summary:     "Report that a claimed task succeeded, with its result",
		Description: "Fenced by the claim's token: 409 when the claim no longer holds (nothing is written; the task runs, or ran, elsewhere).",
		Errors:      []int{http.StatusConflict, http.StatusNotFound},
	}, s.ackTask)
	huma.Register(s.api, huma.Operation{
		OperationID: "fail-task", Method: http.MethodPost, Path: "/v1/queues/{queue}/tasks/{id}/fail", Tags: tags,
		Summary: "Report that a claimed task failed",
		Description: "A transient failure is retried after the task's backoff while its retry budget lasts, then the task is dead; " +
			"a permanent one goes to the dead-letter queue at once. Fenced by the claim's token: 409 when the claim no longer holds.",
		Errors: []int{http.StatusConflict, http.StatusNotFound},
	}, s.failTask)
	s.outcomesRoute(tags)
	s.taskQueryRoutes(tags)
	s.searchRoutes()
	s.dlqRoutes()
	s.pauseRoutes(tags)
}

// PauseResult is a queue's pause state after a pause or a resume.
type PauseResult struct {
	Queue   string     `json:"queue" doc:"The queue."`
	Paused  bool       `json:"paused" doc:"Whether the queue is paused now: it takes submissions, but no worker claims its tasks."`
	Since   *time.Time `json:"since,omitempty" doc:"When the queue was paused (only while it is)."`
	Changed bool       `json:"changed" doc:"False when the queue already was in that state (pausing a paused queue or resuming a running one is not an error)."`
}

// pauseRoutes registers the pause and the resume of a queue.
func (s *Server) pauseRoutes(tags []string) {
	admin := map[string]any{"role": RoleAdmin}
	huma.Register(s.api, huma.Operation{
		OperationID: "pause-queue", Method: http.MethodPost, Path: "/v1/queues/{queue}/pause", Tags: tags, Metadata: admin,
		Summary: "Pause a queue: no worker claims its tasks until it is resumed",
		Description: "From the moment the answer comes, no claim of the queue's tasks commits, in any process (every claim " +
			"transaction is fenced by the pause). Submissions are accepted and tasks already running finish and are acknowledged " +
			"as usual; waiting workers and long polls stay idle until the resume. Pausing a paused queue is not an error " +
			"(changed is false). 404 for a queue never submitted to or configured.",
		Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queuePath) (*struct{ Body PauseResult }, error) {
		return s.setPaused(ctx, in.Queue, true)
	})
	huma.Register(s.api, huma.Operation{
		OperationID: "resume-queue", Method: http.MethodPost, Path: "/v1/queues/{queue}/resume", Tags: tags, Metadata: admin,
		Summary: "Resume a paused queue",
		Description: "Waiting workers and long polls learn of it from their watch of the queue and claim again within a round " +
			"trip. Resuming a queue that is not paused is not an error (changed is false). 404 for an unknown queue.",
		Errors: []int{http.StatusNotFound},
	}, func(ctx context.Context, in *queuePath) (*struct{ Body PauseResult }, error) {
		return s.setPaused(ctx, in.Queue, false)
	})
}

// setPaused pauses queue q, or resumes it.
func (s *Server) setPaused(ctx context.Context, q string, pause bool) (*struct{ Body PauseResult }, error) {
	if err := checkQueue(q); err != nil {
		return nil, err
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	set := c.Resume
	if pause {
		set = c.Pause
	}
	st, err := set(ctx, q)
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	out := PauseResult{Queue: q, Paused: st.Paused, Changed: st.Changed}
	if !st.Since.IsZero() {
		out.Since = &st.Since
	}
	return &struct{ Body PauseResult }{out}, nil
}

// checkQueue validates a queue name of the path.
func checkQueue(q string) error {
	if err := queue.CheckQueue(q); err != nil {
		return problem(err, queueWhere)
	}
	return nil
}

func (s *Server) claimTasks(ctx context.Context, in *claimInput) (*struct{ Body ClaimResult }, error) {
	if err := checkQueue(in.Queue); err != nil {
		return nil, err
	}
	wait, err := s.wait("body.wait", in.Body.Wait)
	if err != nil {
		return nil, err
	}
	tasks, err := s.claimFor(ctx, in.Queue, in.Body.Session, in.Body.Max, wait, false)
	if err != nil {
		return nil, err
	}
	if tasks == nil {
		tasks = []QueueTask{}
	}
	return &struct{ Body ClaimResult }{ClaimResult{Tasks: tasks}}, nil
}

// afterClaim, when set (by tests), runs when a claim has its tasks and
// before its answer is written.
var afterClaim atomic.Pointer[func(ctx context.Context, q string)]

// claimFor claims up to max tasks of queue q (valid) for session, waiting
// up to wait: the claim route's work, and a batch of outcomes' next claim.
func (s *Server) claimFor(ctx context.Context, q, session string, max int, wait time.Duration, once bool) ([]QueueTask, error) {
	sess, err := s.session(ctx, "body.session", session)
	if err != nil {
		return nil, err
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	tasks, err := c.Claim(ctx, q, queue.ClaimRequest{Lease: sess.lease, Worker: sess.holder().ID, Max: max, Wait: wait, Once: once, Logger: s.cfg.Logger})
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return nil, sessionGone(session, s.nsOf(ctx))
	}
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	if hook := afterClaim.Load(); hook != nil {
		(*hook)(ctx, q)
	}
	if ctx.Err() != nil && len(tasks) > 0 {
		// The client left before the answer was written: its tasks go
		// back rather than stay claimed under a session that may live on.
		s.release(ctx, c, q, sess.lease.ID(), tasks)
		return nil, problem(fmt.Errorf("queue: claim from %s: %w", q, ctx.Err()), queueWhere)
	}
	return queueTasksOf(tasks), nil
}

// release hands back tasks claimed under lease for a request that ended
// before its answer was written, each within 5 s and all within 30 s; a
// task it cannot hand back stays claimed until the session ends.
func (s *Server) release(ctx context.Context, c *queue.Client, q string, l clientv3.LeaseID, tasks []*queue.Task) {
	all, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	for _, t := range tasks {
		tctx, tcancel := context.WithTimeout(all, 5*time.Second)
		_, err := c.Release(tctx, queue.Held{Queue: q, ID: t.ID, Token: t.Token, Lease: l})
		tcancel()
		switch {
		case err == nil:
		case errors.Is(err, lease.ErrFenced): // the session ended meanwhile: its claims went with it
			s.cfg.Logger.Debug("http: a task claimed for a request that ended was no longer held", "queue", q, "task", t.ID, "err", err)
		default:
			s.cfg.Logger.Warn("http: could not hand back a task claimed for a request that ended; it is freed when its session ends",
				"queue", q, "task", t.ID, "err", err)
		}
	}
}

// held is the claim a request names; it does not read the session, which
// may have expired (then the claim is gone: 409).
// held names a claim of the request: the session's lease, verified by the
// session id's secret (an ended session is a 409: its claims went with it).
func (s *Server) held(ctx context.Context, q, taskID, session string, token int64) (queue.Held, error) {
	if err := checkQueue(q); err != nil {
		return queue.Held{}, err
	}
	lid, err := s.sessionLease(ctx, "body.session", session)
	if err != nil {
		return queue.Held{}, err
	}
	return queue.Held{Queue: q, ID: taskID, Token: token, Lease: lid}, nil
}

func (s *Server) heartbeatTask(ctx context.Context, in *heartbeatInput) (*struct{ Body HeartbeatResult }, error) {
	h, err := s.held(ctx, in.Queue, in.ID, in.Body.Session, in.Body.Token)
	if err != nil {
		return nil, err
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	t, err := c.Heartbeat(ctx, h)
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	sent := time.Now()
	k, err := s.cli.KeepAliveOnce(ctx, h.Lease)
	if errors.Is(err, rpctypes.ErrLeaseNotFound) {
		// The session ended since the claim was read: the claim went with it.
		return nil, problem(fmt.Errorf("task %s token %d: %w: the session ended", h.ID, h.Token, lease.ErrFenced), nil)
	}
	if err != nil {
		return nil, problem(err, nil)
	}
	return &struct{ Body HeartbeatResult }{HeartbeatResult{TaskID: t.ID, Attempt: t.Attempt, Token: t.Token,
		ExpiresAt: sent.Add(time.Duration(k.TTL) * time.Second).UTC()}}, nil
}

func (s *Server) ackTask(ctx context.Context, in *ackInput) (*queueTaskOutput, error) {
	var d *drover.DeferError
	var result []byte // "result": null is no result, as in the batch route
	if r := in.Body.Result; len(r) > 0 && string(r) != "null" {
		result = r
	}
	if in.Body.Defer != nil {
		if result != nil {
			return nil, invalid("body.defer", nil, "must be alone: a task handed back has no result")
		}
		var err error
		if d, err = deferOf("body.defer", in.Body.Defer); err != nil {
			return nil, err
		}
	}
	h, err := s.held(ctx, in.Queue, in.ID, in.Body.Session, in.Body.Token)
	if err != nil {
		return nil, err
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	if d != nil {
		return s.deferHeld(ctx, c, h, d)
	}
	t, err := c.Ack(ctx, h, result)
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	s.endStream(ctx, h, t, "")
	return &queueTaskOutput{queueTaskOf(t)}, nil
}

func (s *Server) failTask(ctx context.Context, in *failInput) (*queueTaskOutput, error) {
	var d *drover.DeferError
	switch b := in.Body; {
	case b.Defer != nil && (b.Error != "" || b.Permanent):
		return nil, invalid("body.defer", nil, "must be alone: a task handed back does not fail (error, permanent)")
	case b.Defer != nil:
		var err error
		if d, err = deferOf("body.defer", b.Defer); err != nil {
			return nil, err
		}
	case b.Error == "":
		return nil, invalid("body.error", b.Error, "must say what went wrong (or send defer instead)")
	}
	h, err := s.held(ctx, in.Queue, in.ID, in.Body.Session, in.Body.Token)
	if err != nil {
		return nil, err
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	if d != nil {
		return s.deferHeld(ctx, c, h, d)
	}
	t, err := c.Fail(ctx, h, in.Body.Error, in.Body.Permanent)
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	s.endStream(ctx, h, t, in.Body.Error)
	return &queueTaskOutput{queueTaskOf(t)}, nil
}

// queueClientsMax bounds the queue clients a server keeps: one a
// namespace it served.
const queueClientsMax = 256

// queueClientCache keeps one queue.Client per namespace the server
// serves, so that a client's cache of decoded segments lasts from a claim
// to the acks of its tasks (a queue.Client is safe for concurrent use, and
// holds nothing else of a request); the oldest is dropped first beyond
// queueClientsMax.
type queueClientCache struct {
	mu    sync.Mutex
	m     map[string]*queue.Client
	order []string
}

// queueClient is the queue client of the request's namespace.
func (s *Server) queueClient(ctx context.Context) (*queue.Client, error) {
	ns := s.nsOf(ctx)
	qc := &s.queueClients
	qc.mu.Lock()
	defer qc.mu.Unlock()
	if c, ok := qc.m[ns]; ok {
		return c, nil
	}
	c, err := queue.NewClient(s.cli, ns, queue.WithTracerProvider(s.cfg.TracerProvider))
	if err != nil {
		return nil, problem(err, nil)
	}
	if qc.m == nil {
		qc.m = map[string]*queue.Client{}
	}
	if len(qc.order) >= queueClientsMax {
		delete(qc.m, qc.order[0])
		qc.order = qc.order[1:]
	}
	qc.m[ns] = c
	qc.order = append(qc.order, ns)
	s.scanCascades(ns)
	return c, nil
}

// closeAll closes every queue client the server made (their shared
// watches end and are waited for, within ctx); a request after it makes
// a new one.
func (qc *queueClientCache) closeAll(ctx context.Context) {
	qc.mu.Lock()
	m := qc.m
	qc.m, qc.order = nil, nil
	qc.mu.Unlock()
	for _, c := range m {
		_ = c.Close(ctx)
	}
}
