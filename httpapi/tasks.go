package httpapi

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/lock"
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
	}
}

type stepInput struct {
	ID   string `path:"id" minLength:"1" maxLength:"120" doc:"The task's id: letters, digits, '.', '_', '-' and ':'."`
	N    int    `path:"n" minimum:"1" maximum:"100000" doc:"The step's number, 1-based: the claim's next_step."`
	Body struct {
		Session string `json:"session" doc:"The session the claim is bound to."`
		Token   int64  `json:"token" minimum:"1" doc:"The claim's fencing token."`
		Name    string `json:"name,omitempty" maxLength:"200" doc:"The step's name; default \"step N\"."`
		Steps   int    `json:"steps,omitempty" minimum:"1" maximum:"100000" doc:"How many steps the task has, if known: writing step number steps completes the task."`
		State   []byte `json:"state" doc:"The state the step returned, base64; at most 1 MiB decoded."`
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
}
