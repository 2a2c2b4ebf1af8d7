package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/childview"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// AgentTask is an agent task as the API shows it: its last checkpointed
// step, the state that step returned, and who wrote it. It is package
// task's model, the same for Go runners and HTTP clients.
type AgentTask struct {
	TaskID    string `json:"task_id" doc:"The task's id."`
	Step      int    `json:"step" doc:"The last completed (checkpointed) step, 1-based; 0 before any."`
	StepName  string `json:"step_name,omitempty" doc:"The name of that step."`
	Steps     int    `json:"steps,omitempty" doc:"How many steps the task has, when known: writing the last one completes the task."`
	NextStep  int    `json:"next_step,omitempty" doc:"The step to run and write next; absent once the task is completed."`
	Completed bool   `json:"completed" doc:"Whether the task is completed: it never runs again."`
	State     []byte `json:"state,omitempty" doc:"The state the last step returned (its result once completed), base64."`
	// Result repeats a completed task's final state when it is JSON.
	Result json.RawMessage `json:"result,omitempty" doc:"A completed task's result as the JSON value it is, when its final state is JSON text (a result completed with a JSON value is); state holds the same bytes, base64."`
	// WrittenBy and WrittenToken say who wrote the checkpoint.
	WrittenBy    string     `json:"written_by,omitempty" doc:"The worker that wrote the checkpoint (a session's name, or a Go runner's worker id)."`
	WrittenToken int64      `json:"written_token,omitempty" doc:"The claim's fencing token the checkpoint was written under."`
	WrittenAt    *time.Time `json:"written_at,omitempty" doc:"When it was written."`
	// SleepUntil says the task sleeps until then before its next step.
	SleepUntil *time.Time `json:"sleep_until,omitempty" doc:"When the sleep the last step ended with ends: no claim is taken before (a claim then answers sleep_until and holds nothing). Absent when it does not sleep."`
	// WaitingFor says the task waits for a signal before its next step.
	WaitingFor *TaskWait `json:"waiting_for,omitempty" doc:"What the wait the last step ended with waits for: a claim before a signal named is sent (or the wait times out) answers waiting_for and holds nothing. Absent when it does not wait."`
	// History lists the completed steps (GET only).
	History []AgentTaskStep `json:"history,omitempty" doc:"Every completed step, in order: who ran it, under which token, when (GET only)."`
	// Claim is who holds the task now (GET only).
	Claim *LockStatus `json:"claim,omitempty" doc:"Who holds the task's claim now, if anyone (GET only); the lock is named task:{id}."`
}

// AgentTaskStep is the record of one completed step.
type AgentTaskStep struct {
	Step       int       `json:"step" doc:"The step's number, 1-based."`
	Name       string    `json:"name" doc:"The step's name."`
	Worker     string    `json:"worker" doc:"The worker that ran it."`
	Token      int64     `json:"token" doc:"The claim's fencing token it was written under: a change means another worker took over."`
	StartedAt  time.Time `json:"started_at" doc:"When it started (for HTTP clients: when the previous checkpoint was written or the claim taken)."`
	FinishedAt time.Time `json:"finished_at" doc:"When its checkpoint was written."`
}

// AgentTaskClaim is the answer to a claim: the token every write under the
// claim names, and where to resume.
type AgentTaskClaim struct {
	TaskID     string      `json:"task_id" doc:"The task's id."`
	Token      int64       `json:"token,omitempty" doc:"The claim's fencing token: pass it to every step write and to complete. Absent when the task is already completed (nothing is held)."`
	Session    string      `json:"session" doc:"The session the claim is bound to: it lasts until released, completed or the session ends."`
	Holder     lock.Holder `json:"holder" doc:"The holder record, as others see it."`
	ExpiresAt  *time.Time  `json:"expires_at,omitempty" doc:"When the claim ends unless the session is kept alive."`
	Step       int         `json:"step" doc:"The last checkpointed step, 1-based; 0 before any."`
	StepName   string      `json:"step_name,omitempty" doc:"The name of that step."`
	Steps      int         `json:"steps,omitempty" doc:"How many steps the task has, when known."`
	NextStep   int         `json:"next_step,omitempty" doc:"The step to run next: resume here. Absent when completed."`
	Completed  bool        `json:"completed" doc:"The task was completed before: nothing is claimed, state is its result."`
	SleepUntil *time.Time  `json:"sleep_until,omitempty" doc:"The task sleeps until then (its last step ended with a sleep): nothing is claimed; claim again at that time to run the next step."`
	WaitingFor *TaskWait   `json:"waiting_for,omitempty" doc:"The task waits for a signal (its last step ended with wait_signal) and none has come, nor has the wait timed out: nothing is claimed; claim again once the signal was sent."`
	Signal     *Signal     `json:"signal,omitempty" doc:"The signal that ended the wait the last step asked for (or timed_out): the next step runs with it, and its write consumes it."`
	State      []byte      `json:"state,omitempty" doc:"The last checkpointed state, base64: the input of the next step."`
	// Result repeats a completed task's final state when it is JSON.
	Result json.RawMessage `json:"result,omitempty" doc:"A completed task's result as the JSON value it is, when its final state is JSON text; state holds the same bytes, base64."`
	// TraceParent is the task's stored creation context.
	TraceParent string `json:"traceparent,omitempty" doc:"The W3C traceparent kept with the task (its creation context: the first claim's): a claim's attempt span is its child and links to it. Absent when none was given or traced."`
}

// agentTaskPath names a task. Inputs repeat its field rather than embed
// it: huma does not fill parameters of an embedded unexported struct.
type agentTaskPath struct {
	ID string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
}

type claimTaskInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
	Wait string `query:"wait" doc:"How long to wait in line while another holds the task (Go duration: 10s); without it one attempt is made."`
	Body struct {
		Session string `json:"session" doc:"The session the claim is bound to (POST /v1/sessions); keep it alive while working."`
		Steps   int    `json:"steps,omitempty" minimum:"1" maximum:"100000" doc:"How many steps the task has, if known: a checkpoint written with another count is a 409."`
		// TraceParent is the creation context a first claim stores.
		TraceParent string `json:"traceparent,omitempty" maxLength:"55" doc:"The W3C traceparent of the context that runs the task (00-<32 hex>-<16 hex>-<2 hex>): kept with the task by the first claim that gives one (by default, when the server traces, the request's, through the server's span), and answered by every claim, so that each claim's attempt span continues one trace."`
	}
}

type stepInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
	N    int    `path:"n" minimum:"1" maximum:"100000" doc:"The step's number, 1-based: the claim's next_step."`
	Body struct {
		Session string      `json:"session" doc:"The session the claim is bound to."`
		Token   int64       `json:"token" minimum:"1" doc:"The claim's fencing token."`
		Name    string      `json:"name,omitempty" maxLength:"200" doc:"The step's name; default \"step N\"."`
		Steps   int         `json:"steps,omitempty" minimum:"1" maximum:"100000" doc:"How many steps the task has, if known: writing step number steps completes the task."`
		State   Base64Input `json:"state" doc:"The state the step returned, base64; at most 1 MiB decoded."`
		// SleepFor and SleepUntil end the step with a sleep.
		SleepFor   string `json:"sleep_for,omitempty" maxLength:"64" doc:"End the step with a sleep this long (a duration such as 10m, or a number of seconds): the checkpoint is written, the claim released, and the next claim before the sleep ends holds nothing and answers sleep_until."`
		SleepUntil string `json:"sleep_until,omitempty" maxLength:"64" doc:"End the step with a sleep until this RFC 3339 time, with its zone (2026-12-01T09:00:00Z); a time past sleeps not at all."`
		// WaitSignal ends the step with a wait for a signal.
		WaitSignal *WaitSignalInput `json:"wait_signal,omitempty" doc:"End the step with a wait for a signal (POST /v1/tasks/{id}/signals/{name}): the checkpoint is written, the claim released, and a claim answers waiting_for and holds nothing until a signal named is sent or the timeout passes; then the claim answers the signal."`
	}
}

// WaitSignalInput is the wait a step write ends with.
type WaitSignalInput struct {
	Names   []string `json:"names" minItems:"1" maxItems:"16" doc:"The signals waited for: the first of them sent ends the wait."`
	Timeout string   `json:"timeout,omitempty" maxLength:"64" doc:"How long to wait at most (a duration such as 24h, or seconds); absent: no timeout."`
}

// Signal is the signal a claim resumes a task with.
type Signal struct {
	Name           string          `json:"name,omitempty" doc:"The signal's name (absent on a timeout)."`
	Data           json.RawMessage `json:"data,omitempty" doc:"The data it was sent with."`
	IdempotencyKey string          `json:"idempotency_key,omitempty" doc:"The key it was sent with."`
	SentAt         *time.Time      `json:"sent_at,omitempty" doc:"When it was sent."`
	TimedOut       bool            `json:"timed_out,omitempty" doc:"The wait timed out: no signal came."`
}

type completeInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
	Body struct {
		Session string          `json:"session" doc:"The session the claim is bound to."`
		Token   int64           `json:"token" minimum:"1" doc:"The claim's fencing token."`
		Result  json.RawMessage `json:"result,omitempty" doc:"The task's result, kept as its final state: any JSON value, kept as its JSON text, except a string, which is the base64 of the result's bytes (as a step's state is); without it (or null) the last step's state is kept."`
	}
}

type releaseTaskInput struct {
	ID      string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
	Session string `query:"session" required:"true" doc:"The session the claim is bound to."`
	Token   int64  `query:"token" required:"true" minimum:"1" doc:"The claim's fencing token."`
}

type agentTaskOutput struct{ Body AgentTask }

// maxStepBody is the largest step write: the state limit, base64, and room
// for the rest.
const maxStepBody = task.DefaultStateLimit*4/3 + 64<<10

// taskRoutes registers the agent task routes: claim a task under a
// session, write each step's checkpoint fenced by the claim's token,
// complete it; the claim and the fence are package task's, so HTTP clients
// and Go runners exclude each other.
func (s *Server) taskRoutes() {
	tags := []string{"agent tasks"}
	huma.Register(s.api, huma.Operation{
		OperationID: "claim-agent-task", Method: http.MethodPost, Path: "/v1/agent-tasks/{id}/claim", Tags: tags,
		Summary: "Claim an agent task: one holder at a time, resume after its last checkpoint",
		Description: "Takes the task's claim (the lock task:{id}, as a Go runner does) under the session and answers the fencing token, " +
			"the last checkpointed step and its state. 409 while another holds it (?wait=10s waits in line) or a queue worker runs it. " +
			"A completed task is not claimed: the answer says completed. Nor is a sleeping one: the answer says sleep_until. " +
			"Nor is one waiting for a signal that has not come: the answer says waiting_for; once it came (or the wait timed out), " +
			"the claim answers it in signal, and the next step's write consumes it.",
		Errors: []int{http.StatusConflict, http.StatusNotFound},
	}, s.claimTask)
	huma.Register(s.api, huma.Operation{
		OperationID: "put-agent-task-step", Method: http.MethodPut, Path: "/v1/agent-tasks/{id}/steps/{n}", Tags: tags,
		Summary: "Checkpoint a step of a claimed task, fenced by the claim's token",
		Description: "Writes step n's state and record in one transaction that commits only while the claim is held with the token: " +
			"409 once it is lost (the session ended, another took over) and nothing is written. n must be the next step; " +
			"repeating the last write is answered as it was. 507 while etcd is past its high-water mark. " +
			"With sleep_for or sleep_until the step ends with a sleep: its checkpoint says when the sleep ends and the claim is released. " +
			"With wait_signal it ends with a wait for a signal, and the claim is released.",
		MaxBodyBytes: maxStepBody,
		// A large body may take as long to arrive as the route's bound.
		BodyReadTimeout: bulkAllowance,
		Errors:          []int{http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.putTaskStep)
	huma.Register(s.api, huma.Operation{
		OperationID: "complete-agent-task", Method: http.MethodPost, Path: "/v1/agent-tasks/{id}/complete", Tags: tags,
		Summary:      "Complete a claimed task (fenced), keep its result and release the claim",
		MaxBodyBytes: maxStepBody,
		// A large body may take as long to arrive as the route's bound.
		BodyReadTimeout: bulkAllowance,
		Errors:          []int{http.StatusConflict, http.StatusRequestEntityTooLarge, http.StatusInsufficientStorage},
	}, s.completeTask)
	huma.Register(s.api, huma.Operation{
		OperationID: "release-agent-task", Method: http.MethodDelete, Path: "/v1/agent-tasks/{id}/claim", Tags: tags,
		Summary:       "Give up a claim without completing: the next claim resumes after the last checkpoint",
		DefaultStatus: http.StatusNoContent,
		Errors:        []int{http.StatusConflict},
	}, s.releaseTask)
	huma.Register(s.api, huma.Operation{
		OperationID: "get-agent-task", Method: http.MethodGet, Path: "/v1/agent-tasks/{id}", Tags: tags,
		Summary: "Read a task: its last checkpoint, step history and current claim; 404 when it has none of them",
		Errors:  []int{http.StatusNotFound},
	}, s.getTask)
	s.childrenRoutes()
}

type searchInput struct {
	Queue    string   `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Status   string   `query:"status" maxLength:"16" doc:"Only tasks in this status (indexed): SCHEDULED, PENDING, RUNNING, RETRYING, SUCCEEDED, DEAD or CANCELLED, in any case (pending), as the CLI takes it."`
	Type     string   `query:"type" maxLength:"128" doc:"Only tasks of this task_type (checked on the tasks read)."`
	IDPrefix string   `query:"id_prefix" maxLength:"128" doc:"Only tasks whose id starts with this (a range read of the id index)."`
	Param    []string `query:"param,explode" maxItems:"16" doc:"Only tasks whose parameters hold key=value (the value as JSON when it parses, else as a string); repeat for more (all must hold). Checked on the tasks read."`
	Since    string   `query:"since" maxLength:"64" doc:"Only tasks created at or after this: RFC 3339, or a duration back from now (1h, 90m)."`
	Until    string   `query:"until" maxLength:"64" doc:"Only tasks created before this: RFC 3339, or a duration back from now."`
	Limit    int      `query:"limit" minimum:"1" maximum:"1000" default:"100" doc:"The most tasks on the page."`
	Cursor   string   `query:"cursor" maxLength:"1024" doc:"The next_cursor of the page before, from the same query; a cursor of another query is refused."`
}

// SearchPage is one page of a search.
type SearchPage struct {
	Data       []QueueTask `json:"data" doc:"The tasks of the page; may be short, or empty, while next_cursor is set: the page read its budget of tasks first."`
	NextCursor string      `json:"next_cursor,omitempty" doc:"Pass as cursor, with the same query, for the next page; absent once every task was walked."`
	Scanned    int         `json:"scanned" doc:"How many tasks (and index keys) the page read."`
}

// searchWhere maps the search's input fields to the API's locations.
var searchWhere = map[string]string{"queue": "path.queue", "status": "query.status", "type": "query.type", "id_prefix": "query.id_prefix",
	"param": "query.param", "since": "query.since", "until": "query.until", "limit": "query.limit", "cursor": "query.cursor"}

// searchRoutes registers the search of a queue's tasks (drover tasks
// search).
func (s *Server) searchRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "search-queue-tasks", Method: http.MethodGet, Path: "/v1/queues/{queue}/search", Tags: []string{"queues"},
		Summary: "Find a queue's tasks by status, type, id prefix, parameters and creation time, a page at a time",
		Description: "Every filter given must hold. Pass a page's next_cursor as cursor, with the same filters, for the next page. " +
			"A page reads at most a budget of tasks, so it may come back short or empty with a next_cursor: keep going until it is absent. " +
			"404 when the queue does not exist.",
		Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *searchInput) (*struct{ Body SearchPage }, error) {
		c, err := s.queueFor(ctx, in.Queue)
		if err != nil {
			return nil, err
		}
		sq := queue.SearchQuery{Status: queue.Status(in.Status), Type: in.Type, IDPrefix: in.IDPrefix, Since: in.Since, Until: in.Until,
			Limit: in.Limit, Cursor: in.Cursor}
		for _, p := range in.Param {
			k, v, ok := strings.Cut(p, "=")
			if !ok {
				return nil, problem(&drover.InputError{Field: "param", Value: p, Rule: "must be key=value"}, searchWhere)
			}
			sq.Params = append(sq.Params, queue.ParamFilter{Key: k, Value: v})
		}
		page, err := c.Search(ctx, in.Queue, sq)
		if err != nil {
			return nil, problem(err, searchWhere)
		}
		return &struct{ Body SearchPage }{SearchPage{Data: queueTasksOf(page.Tasks), NextCursor: page.Next, Scanned: page.Scanned}}, nil
	})
}

// TaskChildren is the children a step task spawned: the counts of every
// step that spawned, and one page of the children with their states.
type TaskChildren struct {
	Spawned   int64            `json:"spawned" doc:"How many children the task's steps spawned, in all."`
	Succeeded int64            `json:"succeeded" doc:"How many of them ended SUCCEEDED."`
	Failed    int64            `json:"failed" doc:"How many ended DEAD or CANCELLED."`
	Live      int64            `json:"live" doc:"How many have not ended yet (pending, running, retrying, sleeping, waiting, or not submitted yet)."`
	Steps     []TaskChildStep  `json:"steps" doc:"The same counts for each step that spawned, in step order."`
	Children  []TaskChildState `json:"children" doc:"A page of the children, in step order and then in the order their step listed them, each with its state as read now."`
	// NextCursor continues the page.
	NextCursor string `json:"next_cursor,omitempty" doc:"More children follow: pass it as cursor to GET /v1/queues/{queue}/tasks/{id}/children for the next page."`
}

// TaskChildStep is what one step spawned and how its children stand.
type TaskChildStep struct {
	Step      int   `json:"step" doc:"The step that spawned them."`
	Spawned   int   `json:"spawned" doc:"How many it spawned."`
	Submitted bool  `json:"submitted" doc:"Every one of them was submitted (false for a moment after the step's checkpoint)."`
	Succeeded int64 `json:"succeeded" doc:"How many ended SUCCEEDED."`
	Failed    int64 `json:"failed" doc:"How many ended DEAD or CANCELLED."`
	Live      int64 `json:"live" doc:"How many have not ended yet."`
}

// TaskChildState is one child and its state.
type TaskChildState struct {
	ID       string `json:"task_id" doc:"The child's id."`
	Queue    string `json:"queue" doc:"The queue it went to."`
	Type     string `json:"task_type" doc:"Its task type."`
	Step     int    `json:"step" doc:"The parent's step that spawned it."`
	Status   string `json:"status" doc:"Its state: a task status, NOT_SUBMITTED before its submission, or REMOVED once its record and outcome are gone."`
	Error    string `json:"error,omitempty" doc:"Its last error, or the error of its outcome."`
	Detached bool   `json:"detached,omitempty" doc:"It is not cancelled with its parent."`
}

// taskChildrenFirst is how many children a task's GET lists.
const taskChildrenFirst = 20

type childrenInput struct {
	Queue  string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	ID     string `path:"id" minLength:"1" maxLength:"128" doc:"The parent task's id."`
	Limit  int    `query:"limit" minimum:"1" maximum:"200" default:"50" doc:"The most children on the page."`
	Cursor string `query:"cursor" maxLength:"64" doc:"The next_cursor of the page before."`
}

// childrenRoutes registers the route that pages through a task's
// children.
func (s *Server) childrenRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "list-task-children", Method: http.MethodGet, Path: "/v1/queues/{queue}/tasks/{id}/children", Tags: []string{"queues"},
		Summary: "A step task's children: counts by state for each step, and a page of the children with their states",
		Description: "The counts come from the children's outcomes (count-only reads); the page reads each listed child's record. " +
			"A task that spawned none answers zero counts and no children. 404 when the task is not in the queue.",
		Errors: []int{http.StatusBadRequest, http.StatusNotFound},
	}, func(ctx context.Context, in *childrenInput) (*struct{ Body TaskChildren }, error) {
		t, err := s.queueTask(ctx, &queueTaskPath{Queue: in.Queue, ID: in.ID})
		if err != nil {
			return nil, err
		}
		ch, err := s.taskChildren(ctx, t.ID, in.Cursor, in.Limit)
		if err != nil {
			return nil, err
		}
		if ch == nil {
			ch = &TaskChildren{Steps: []TaskChildStep{}, Children: []TaskChildState{}}
		}
		return &struct{ Body TaskChildren }{*ch}, nil
	})
}

// taskChildren reads a page of task id's children; nil when it spawned
// none.
func (s *Server) taskChildren(ctx context.Context, id, cursor string, limit int) (*TaskChildren, error) {
	p, err := childview.Read(ctx, childview.Source{Etcd: s.cli, Namespace: s.nsOf(ctx)}, id, cursor, limit)
	if err != nil {
		return nil, problem(err, map[string]string{"cursor": "query.cursor"})
	}
	if len(p.Steps) == 0 {
		return nil, nil
	}
	out := &TaskChildren{Spawned: p.Spawned, Succeeded: p.Succeeded, Failed: p.Failed, Live: p.Live, NextCursor: p.Next,
		Steps: make([]TaskChildStep, len(p.Steps)), Children: make([]TaskChildState, len(p.Children))}
	for i, st := range p.Steps {
		out.Steps[i] = TaskChildStep(st)
	}
	for i, c := range p.Children {
		out.Children[i] = TaskChildState(c)
	}
	return out, nil
}

// addFamily adds to out, task t as the API shows it, the queue of its
// parent (from the parent's index key alone: its record may be large) and
// the first page of its children.
func (s *Server) addFamily(ctx context.Context, t *queue.Task, out *QueueTask) error {
	if t.Parent != "" {
		keys, err := keyspace.New(s.nsOf(ctx))
		if err != nil {
			return err
		}
		g, err := s.cli.Get(ctx, keys.TaskIndex(t.Parent))
		if err != nil {
			return problem(fmt.Errorf("read where parent %s is: %w", t.Parent, err), nil)
		}
		if len(g.Kvs) > 0 {
			if at, ok := keyspace.ParseTaskPlace(string(g.Kvs[0].Value)); ok {
				out.ParentQueue = at.Queue
			}
		}
	}
	ch, err := s.taskChildren(ctx, t.ID, "", taskChildrenFirst)
	out.Children = ch
	return err
}
