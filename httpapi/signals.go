package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

type signalInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id."`
	Name string `path:"name" minLength:"1" maxLength:"128" doc:"The signal's name: letters, digits, '.', '_', '-' and ':'."`
	Key  string `header:"Idempotency-Key" maxLength:"128" doc:"The signal's idempotency key, when the body gives none: a signal sent again with the same name and key is delivered once."`
	// Body is optional: a signal without data needs none.
	Body *struct {
		Data           json.RawMessage `json:"data,omitempty" doc:"The signal's data: any JSON value, at most 64 KiB; the step that waits for the signal gets it."`
		IdempotencyKey string          `json:"idempotency_key,omitempty" maxLength:"128" doc:"The signal's idempotency key (or the Idempotency-Key header): a signal sent again with the same name and key is stored and delivered once. Without one the server makes a random key: a retry is then a second signal."`
	}
}

// SignalResult is what a signal did.
type SignalResult struct {
	TaskID         string       `json:"task_id" doc:"The task."`
	Name           string       `json:"name" doc:"The signal's name."`
	IdempotencyKey string       `json:"idempotency_key" doc:"The key the signal is stored under (the one given, or a random one)."`
	Stored         bool         `json:"stored" doc:"The signal was stored in the task's inbox, until a step that waits for it consumes it. false: a signal with this name and key was sent before (it waits in the inbox, or was consumed); nothing was written."`
	Woke           bool         `json:"woke" doc:"The task was parked WAITING for this signal and is now PENDING: a worker resumes it at its next step, with the signal."`
	Status         queue.Status `json:"current_status" doc:"The task's state as the signal found it."`
}

// TaskWait is what a WAITING task waits for.
type TaskWait struct {
	Signals []string   `json:"signals,omitempty" doc:"The names of the signals it waits for: the first of them sent ends the wait."`
	Since   time.Time  `json:"since,omitzero" doc:"When the wait began."`
	Until   *time.Time `json:"until,omitempty" doc:"When the wait times out: the next step then runs with a timeout instead of a signal. Absent: no timeout."`
	// Children is set for a wait for the children a step spawned.
	Children *TaskChildrenWait `json:"children,omitempty" doc:"For a task that waits for the children a step spawned: which step, how many it spawned, how many must end."`
}

// TaskChildrenWait is a wait for the children a step spawned.
type TaskChildrenWait struct {
	Step    int  `json:"step" doc:"The step that spawned them."`
	N       int  `json:"n" doc:"How many it spawned."`
	Wait    int  `json:"wait" doc:"How many must end before the next step runs."`
	Collect bool `json:"collect,omitempty" doc:"Every outcome is collected; otherwise the first child that ends DEAD or CANCELLED ends the wait: a queue task then fails (DEAD), an agent task's next step is claimed and decides (failed_child in the children read)."`
}

// TaskSignal is a signal a task received.
type TaskSignal struct {
	Name           string          `json:"name" doc:"The signal's name."`
	IdempotencyKey string          `json:"idempotency_key" doc:"The key it was sent with."`
	SentAt         *time.Time      `json:"sent_at,omitempty" doc:"When it was sent (the server's clock)."`
	Data           json.RawMessage `json:"data,omitempty" doc:"Its data, while it waits to be consumed."`
	Consumed       bool            `json:"consumed" doc:"A step received it and its checkpoint was written: it is never delivered again."`
	ConsumedAt     *time.Time      `json:"consumed_at,omitempty" doc:"When it was consumed."`
}

// taskWaitOf is w as the API shows it; nil for nil.
func taskWaitOf(w *queue.WaitingFor) *TaskWait {
	if w == nil {
		return nil
	}
	out := &TaskWait{Signals: w.Signals, Since: w.Since}
	if c := w.Children; c != nil {
		out.Children = &TaskChildrenWait{Step: c.Step, N: c.N, Wait: c.Wait, Collect: c.Collect}
	}
	if !w.Until.IsZero() {
		until := w.Until
		out.Until = &until
	}
	return out
}

// taskSignalsOf is rs as the API shows them.
func taskSignalsOf(rs []task.SignalRecord) []TaskSignal {
	out := make([]TaskSignal, 0, len(rs))
	for _, r := range rs {
		s := TaskSignal{Name: r.Name, IdempotencyKey: r.IdempotencyKey, Data: r.Data, Consumed: r.Consumed}
		if !r.SentAt.IsZero() {
			at := r.SentAt
			s.SentAt = &at
		}
		if !r.ConsumedAt.IsZero() {
			at := r.ConsumedAt
			s.ConsumedAt = &at
		}
		out = append(out, s)
	}
	return out
}

// signalWhere maps Client.Signal's input fields to request locations.
var signalWhere = map[string]string{"task id": "path.id", "signal name": "path.name", "idempotency key": "body.idempotency_key", "data": "body.data"}

// signalRoutes registers the route that sends a task a signal, and the
// agent task routes of child tasks (spawnRoutes).
func (s *Server) signalRoutes() {
	s.spawnRoutes()
	huma.Register(s.api, huma.Operation{
		OperationID: "send-task-signal", Method: http.MethodPost, Path: "/v1/tasks/{id}/signals/{name}", Tags: []string{"queues"},
		Summary: "Send a task a signal: a step that waits for it (human approval, a reply) resumes with its data",
		Description: "Stores the signal in the task's inbox until a step that waits for it consumes it; when the task is parked " +
			"WAITING for it, the same transaction makes it PENDING and a worker resumes it. A signal sent before the task waits " +
			"is kept for the wait. The same name and idempotency key sent again is stored and delivered once. 404 for an " +
			"unknown task, 409 for a finished one (SUCCEEDED, DEAD, CANCELLED), 400 for a bad name, key or data, 507 while " +
			"etcd is past its high-water mark (nothing stored, the task not woken: send it again later).",
		DefaultStatus: http.StatusAccepted,
		Errors:        []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict, http.StatusInsufficientStorage},
	}, func(ctx context.Context, in *signalInput) (*struct{ Body SignalResult }, error) {
		c, err := s.queueClient(ctx)
		if err != nil {
			return nil, err
		}
		idem, where := in.Key, signalWhere
		var data json.RawMessage
		if in.Body != nil {
			data = in.Body.Data
			if in.Body.IdempotencyKey != "" {
				if idem != "" && idem != in.Body.IdempotencyKey {
					return nil, invalid("body.idempotency_key", in.Body.IdempotencyKey, "must match the Idempotency-Key header, or give only one")
				}
				idem = in.Body.IdempotencyKey
			}
		}
		if in.Key != "" && (in.Body == nil || in.Body.IdempotencyKey == "") {
			where = map[string]string{"task id": "path.id", "signal name": "path.name", "idempotency key": "header.Idempotency-Key", "data": "body.data"}
		}
		if string(data) == "null" {
			data = nil
		}
		res, err := c.Signal(ctx, in.ID, in.Name, data, idem)
		if err != nil {
			if errors.Is(err, queue.ErrFinished) || errors.Is(err, queue.ErrNotFound) {
				return nil, problem(err, nil)
			}
			return nil, problem(err, where)
		}
		return &struct{ Body SignalResult }{SignalResult{TaskID: in.ID, Name: in.Name, IdempotencyKey: res.IdempotencyKey,
			Stored: res.Stored, Woke: res.Woke, Status: res.Status}}, nil
	})
}

// Child tasks of agent tasks. A step write on the spawn route checkpoints
// the step with its children's plan (task.Store.CommitSpawn, the Go API's
// own machinery), submits them, and releases the claim; a claim then holds
// nothing and answers waiting_for.children until enough children ended,
// and the outcomes are read on the children routes.

// ChildInput is a child task a step spawns.
type ChildInput struct {
	Key        string          `json:"key,omitempty" doc:"Names the child within its step: its id is {task}.{step}.{key} (default: its 0-based position). Letters, digits, '_', '-', ':'; no '.'."`
	Queue      string          `json:"queue" doc:"The queue it is submitted to: it must exist (submitted to, or configured with drover queues set)."`
	Type       string          `json:"task_type" doc:"The child's task type: what its worker does with it."`
	Parameters json.RawMessage `json:"parameters,omitempty" doc:"The child's input: any JSON value."`
	Priority   int             `json:"priority,omitempty" minimum:"0" maximum:"1000" doc:"0 to 1000, higher first."`
	MaxRetries *int            `json:"max_retries,omitempty" minimum:"0" maximum:"100" doc:"The child's retry budget, 0 to 100; default 3."`
	Timeout    string          `json:"timeout,omitempty" maxLength:"64" doc:"What one attempt of the child may take (a duration such as 10m, or seconds)."`
	Detached   bool            `json:"detached,omitempty" doc:"Not cancelled with its parent."`
}

type spawnStepInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
	N    int    `path:"n" minimum:"1" maximum:"100000" doc:"The step's number, 1-based: the claim's next_step."`
	Body struct {
		Session  string       `json:"session" doc:"The session the claim is bound to."`
		Token    int64        `json:"token" minimum:"1" doc:"The claim's fencing token."`
		Name     string       `json:"name,omitempty" maxLength:"200" doc:"The step's name; default \"step N\"."`
		Steps    int          `json:"steps,omitempty" minimum:"1" maximum:"100000" doc:"How many steps the task has, if known. A spawn cannot end the last one."`
		State    Base64Input  `json:"state" doc:"The state the step returned, base64; at most 1 MiB decoded."`
		Children []ChildInput `json:"children" maxItems:"10000" doc:"The children to spawn, at most 10,000; an empty list spawns nothing and the write is a plain step write."`
		Wait     int          `json:"wait,omitempty" minimum:"0" doc:"Resume once this many children ended (0: all of them); must be 0 with an empty children list."`
		Collect  bool         `json:"collect,omitempty" doc:"Wait for the outcomes whatever they are. Without it the first child that ends DEAD or CANCELLED ends the wait at once (the children read says which: failed_child)."`
	}
}

// AgentTaskChildren is a page of the outcomes of the children a step spawned.
type AgentTaskChildren struct {
	TaskID      string         `json:"task_id" doc:"The parent task."`
	Step        int            `json:"step" doc:"The step that spawned them."`
	N           int            `json:"n" doc:"How many it spawned."`
	Wait        int            `json:"wait,omitempty" doc:"How many must end before the next step (the last checkpoint's step only)."`
	Collect     bool           `json:"collect,omitempty" doc:"Every outcome is waited for (the last checkpoint's step only)."`
	Submitted   bool           `json:"submitted" doc:"Every child was submitted to its queue (a claim submits them if a crash cut the spawning write short)."`
	Ended       int64          `json:"ended" doc:"How many ended: SUCCEEDED, DEAD or CANCELLED (a retry does not end a child)."`
	Failed      int64          `json:"failed" doc:"How many of those ended DEAD or CANCELLED."`
	Ready       bool           `json:"ready" doc:"The wait is over: the next claim answers a token (the last checkpoint's step only)."`
	FailedChild *ChildOutcome  `json:"failed_child,omitempty" doc:"Without collect: a child that ended DEAD or CANCELLED, which ended the wait; the step decides what to do."`
	Outcomes    []ChildOutcome `json:"outcomes" doc:"The children that ended, in id order, from after on."`
	Next        string         `json:"next,omitempty" doc:"Pass as after for the next page; absent on the last page."`
}

// ChildOutcome is how a child ended, or where it is.
type ChildOutcome struct {
	ID     string          `json:"id" doc:"The child's id."`
	Status string          `json:"status" doc:"SUCCEEDED, DEAD or CANCELLED once it ended; before that its queue status (PENDING, RUNNING, RETRYING, ...), or PLANNED when it is not submitted yet."`
	Ended  bool            `json:"ended" doc:"It ended: its outcome is final."`
	Result json.RawMessage `json:"result,omitempty" doc:"What it returned (JSON; other text as a JSON string), at most 64 KiB."`
	Error  string          `json:"error,omitempty" doc:"Why it ended DEAD or CANCELLED."`
	Queue  string          `json:"queue,omitempty" doc:"Its queue (reads of one child)."`
}

type agentChildrenInput struct {
	ID    string `path:"id" minLength:"1" maxLength:"120" doc:"The parent task's id."`
	Step  int    `query:"step" minimum:"0" maximum:"100000" doc:"The step whose children to list; default the last checkpointed step."`
	After string `query:"after" maxLength:"128" doc:"List the outcomes of children with ids after this one (a page's next)."`
	Limit int    `query:"limit" minimum:"0" maximum:"500" doc:"The most outcomes in the page; default 100."`
}

type childInput struct {
	ID    string `path:"id" minLength:"1" maxLength:"120" doc:"The parent task's id."`
	Child string `path:"child" minLength:"1" maxLength:"120" doc:"The child's id: one of the ids the parent's steps spawned."`
}

// spawnRoutes registers the agent task routes of child tasks.
func (s *Server) spawnRoutes() {
	tags := []string{"agent tasks"}
	huma.Register(s.api, huma.Operation{
		OperationID: "spawn-agent-task-step", Method: http.MethodPut, Path: "/v1/agent-tasks/{id}/steps/{n}/spawn", Tags: tags,
		Summary: "Checkpoint a step that spawns child tasks, fenced by the claim's token, and release the claim",
		Description: "As the step write, with children: their plan is written with the step's checkpoint, fenced by the claim, before any " +
			"child is submitted; then they are submitted (each id {task}.{n}.{key}, once) and the claim released. Idempotent per step: a step " +
			"written again after a crash (before its checkpoint committed) spawns only its own list, and once committed the step " +
			"cannot be written again (409). A claim then answers waiting_for.children and holds nothing until wait children ended " +
			"(or, without collect, one failed); the outcomes are read with GET /v1/agent-tasks/{id}/children. 400 naming the field " +
			"for a queue that does not exist (body.children[3].queue), a bad child, two children with one key, or wait above their number.",
		MaxBodyBytes:    maxStepBody + 32<<20,
		BodyReadTimeout: bulkAllowance,
		Errors:          []int{http.StatusBadRequest, http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.spawnTaskStep)
	huma.Register(s.api, huma.Operation{
		OperationID: "list-agent-task-children", Method: http.MethodGet, Path: "/v1/agent-tasks/{id}/children", Tags: tags,
		Summary: "Read the outcomes of the children a step of an agent task spawned, a page at a time",
		Description: "The counts (submitted, ended, failed, ready) and the outcomes of the children that ended (status, result, error), " +
			"in id order. The step after a spawn reads them once its claim answered a token.",
		Errors: []int{http.StatusNotFound},
	}, s.listChildren)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-agent-task-child", Method: http.MethodGet, Path: "/v1/agent-tasks/{id}/children/{child}", Tags: tags,
		Summary:     "Read one child of an agent task: its outcome once it ended, its queue status before",
		Description: "404 (not-a-child, naming path.child) for an id that none of the task's steps spawned.",
		Errors:      []int{http.StatusNotFound},
	}, s.getChild)
}

// childWhere maps the fields a spawn's errors name to request locations.
func childWhere(err error) error {
	var ie *drover.InputError
	if errors.As(err, &ie) && (strings.HasPrefix(ie.Field, "children") || ie.Field == "wait") {
		return problem(err, map[string]string{ie.Field: "body." + ie.Field})
	}
	return taskProblem(err)
}

func (s *Server) spawnTaskStep(ctx context.Context, in *spawnStepInput) (*agentTaskOutput, error) {
	b := in.Body
	if err := checkStepWrite(in.N, b.Steps, b.State.Bytes()); err != nil {
		return nil, err
	}
	if len(b.Children) == 0 && b.Wait != 0 {
		return nil, invalid("body.wait", b.Wait, "must be 0 when children is empty: an empty list spawns nothing and waits for nothing")
	}
	req := &task.SpawnRequest{Children: make([]task.Child, len(b.Children)), Options: task.SpawnOptions{Wait: b.Wait, Collect: b.Collect}}
	for i, c := range b.Children {
		var timeout time.Duration
		if c.Timeout != "" {
			field := fmt.Sprintf("body.children[%d].timeout", i)
			sr, err := task.ParseSleep(field, c.Timeout)
			if err != nil || !sr.Until.IsZero() || sr.For <= 0 {
				return nil, invalid(field, c.Timeout, "must be a positive duration such as 10m, or a number of seconds")
			}
			timeout = sr.For
		}
		req.Children[i] = task.Child{Key: c.Key, Queue: c.Queue, Type: c.Type, Parameters: c.Parameters, Priority: c.Priority,
			MaxRetries: c.MaxRetries, Timeout: timeout, Detached: c.Detached}
	}
	return s.writeStep(ctx, in.ID, in.N, stepWrite{Session: b.Session, Token: b.Token, Name: b.Name, Steps: b.Steps, State: b.State.Bytes(), Spawn: req})
}

// commitStep commits step write next after cp under fence f, consuming sg;
// with children to spawn (sp), their plan goes with it and they are
// submitted after it (a failure to submit is left to the next claim).
func (s *Server) commitStep(ctx context.Context, store *task.Store, f lease.Fence, cp task.Checkpoint, next *task.Checkpoint, rec task.StepRecord, sg *task.Signal, sp *task.SpawnRequest) error {
	if sp == nil {
		if err := store.CommitSignal(ctx, f, cp, next, rec, sg); err != nil {
			return taskProblem(err)
		}
		return nil
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return err
	}
	if err := store.CommitSpawn(ctx, f, c.Spawner(""), cp, next, rec, sg, sp); err != nil {
		return childWhere(err)
	}
	if next.Spawn == nil {
		return nil
	}
	var cf *task.ChildFailedError
	if _, err := store.AwaitChildren(ctx, f, c.Spawner(""), *next); err != nil && !errors.As(err, &cf) {
		s.cfg.Logger.Warn("agent task: children not submitted yet; the next claim submits them", "task", next.TaskID, "step", next.Step, "err", err)
	}
	return nil
}

// awaitChildren is what a claim of a task whose checkpoint cp spawned
// children (held by fence f) finds: whether the wait is over, after making
// sure they were submitted.
func (s *Server) awaitChildren(ctx context.Context, store *task.Store, f lease.Fence, cp task.Checkpoint) (bool, error) {
	c, err := s.queueClient(ctx)
	if err != nil {
		return false, err
	}
	w, err := store.AwaitChildren(ctx, f, c.Spawner(""), cp)
	var cf *task.ChildFailedError
	if errors.As(err, &cf) {
		return true, nil // under the default policy a failed child ends the wait
	}
	if err != nil {
		return false, taskProblem(err)
	}
	return w.Ready(), nil
}

func (s *Server) listChildren(ctx context.Context, in *agentChildrenInput) (*struct{ Body AgentTaskChildren }, error) {
	if err := task.CheckID(in.ID); err != nil {
		return nil, problem(err, taskWhere)
	}
	store, err := s.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	cp, err := store.Load(ctx, in.ID)
	if err != nil {
		return nil, taskProblem(err)
	}
	out := AgentTaskChildren{TaskID: in.ID, Step: in.Step, Outcomes: []ChildOutcome{}}
	if out.Step == 0 {
		out.Step = cp.Step
	}
	if cp.Spawn != nil && out.Step == cp.Step {
		out.N, out.Wait, out.Collect = cp.Spawn.N, cp.Spawn.Wait, cp.Spawn.Collect
	} else {
		plan, err := store.Plan(ctx, in.ID, out.Step)
		if err != nil {
			return nil, taskProblem(err)
		}
		out.N = len(plan)
	}
	if out.N == 0 {
		return nil, newProblem(http.StatusNotFound, "not-found", fmt.Sprintf("step %d of agent task %s spawned no children", out.Step, in.ID))
	}
	w, err := store.CountChildren(ctx, in.ID, out.Step)
	if err != nil {
		return nil, taskProblem(err)
	}
	out.Submitted, out.Ended, out.Failed = w.Submitted, w.Done, w.Failed
	if cp.Spawn != nil && out.Step == cp.Step {
		w.SpawnRecord = *cp.Spawn
		out.Ready = w.Submitted && w.Ready()
	}
	limit := in.Limit
	if limit == 0 {
		limit = 100
	}
	page, next, err := store.ChildrenOf(ctx, in.ID, out.Step, in.After, limit)
	if err != nil {
		return nil, taskProblem(err)
	}
	for _, o := range page {
		out.Outcomes = append(out.Outcomes, ChildOutcome{ID: o.ID, Status: o.Status, Ended: true, Result: o.Result, Error: o.Error})
	}
	out.Next = next
	if cp.Spawn != nil && out.Step == cp.Step && !out.Collect && out.Failed > 0 {
		o, ok, err := store.FailedChild(ctx, in.ID, out.Step)
		if err != nil {
			return nil, taskProblem(err)
		}
		if ok {
			out.FailedChild = &ChildOutcome{ID: o.ID, Status: o.Status, Ended: true, Result: o.Result, Error: o.Error}
		}
	}
	return &struct{ Body AgentTaskChildren }{out}, nil
}

func (s *Server) getChild(ctx context.Context, in *childInput) (*struct{ Body ChildOutcome }, error) {
	if err := task.CheckID(in.ID); err != nil {
		return nil, problem(err, taskWhere)
	}
	store, err := s.taskStore(ctx)
	if err != nil {
		return nil, err
	}
	if step, _, ok := task.ParseChildID(in.ID, in.Child); ok {
		if o, ended, err := store.ChildOutcome(ctx, in.ID, step, in.Child); err != nil {
			return nil, taskProblem(err)
		} else if ended {
			return s.childOf(ctx, in.Child, "", &o)
		}
		plan, err := store.Plan(ctx, in.ID, step)
		if err != nil {
			return nil, taskProblem(err)
		}
		for _, ch := range plan {
			if ch.ID == in.Child {
				return s.childOf(ctx, in.Child, ch.Queue, nil)
			}
		}
	}
	rule := fmt.Sprintf("must be a child task %s spawned: a step's children are %s.{step}.{key} (GET /v1/agent-tasks/%s/children lists them)", in.ID, in.ID, in.ID)
	p := newProblem(http.StatusNotFound, "not-a-child", fmt.Sprintf("%s is not a child of task %s: path.child %s", in.Child, in.ID, rule))
	p.Errors = []*huma.ErrorDetail{{Location: "path.child", Message: rule, Value: in.Child}}
	return nil, p
}

// childOf is child id (of queue q, when known) as the API shows it: its
// outcome o once it ended, its queue's record before (PLANNED until it
// is submitted).
func (s *Server) childOf(ctx context.Context, id, q string, o *task.ChildOutcome) (*struct{ Body ChildOutcome }, error) {
	out := ChildOutcome{ID: id, Queue: q, Status: "PLANNED"}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	t, err := c.Get(ctx, id)
	switch {
	case errors.Is(err, queue.ErrNotFound):
	case err != nil:
		return nil, problem(err, nil)
	default:
		out.Queue, out.Status = t.Queue, string(t.CurrentStatus)
	}
	if o != nil {
		out.Status, out.Ended, out.Result, out.Error = o.Status, true, o.Result, o.Error
	}
	return &struct{ Body ChildOutcome }{out}, nil
}
