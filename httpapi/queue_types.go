package httpapi

import (
	"encoding/json"
	"github.com/droverhq/drover/budget"
	"reflect"
	"time"

	"github.com/droverhq/drover/queue"
)

// QueueTask is a queued task as the API shows it: what its submitter gave
// and what drover adds to run it.
type QueueTask struct {
	ID               string            `json:"task_id" doc:"The task's id, unique across queues."`
	Type             string            `json:"task_type" doc:"The task's type: what its worker does with it."`
	Queue            string            `json:"queue" doc:"The queue it is in."`
	InputDataURI     string            `json:"input_data_uri,omitempty" doc:"Where the task's input is."`
	OutputDataURI    string            `json:"output_data_uri,omitempty" doc:"Where the task's output goes."`
	Parameters       json.RawMessage   `json:"parameters,omitempty" doc:"The task's parameters: any JSON value."`
	Metadata         QueueTaskMetadata `json:"metadata" doc:"When the task was created, its priority, source and tenant."`
	Status           queue.Status      `json:"current_status" enum:"SCHEDULED,PENDING,RUNNING,SUCCEEDED,RETRYING,SLEEPING,WAITING,DEAD,CANCELLED" doc:"The task's state when it was read."`
	Attempt          int               `json:"attempt" doc:"The number of the current or last attempt (1-based; 0 before the first)."`
	Token            int64             `json:"token,omitempty" doc:"The fencing token of the current attempt's claim: heartbeat, ack and fail need it."`
	RetriesAttempted int               `json:"retries_attempted" doc:"The attempts after the first that have run."`
	MaxRetries       int               `json:"max_retries" doc:"The task's retry budget."`
	LastError        string            `json:"last_error,omitempty" doc:"The error of the last failed attempt."`
	Timeout          string            `json:"timeout,omitempty" doc:"What one attempt may take (a Go duration), when the task sets it."`
	BackoffBase      string            `json:"backoff_base,omitempty" doc:"The first retry's backoff bound, when the task sets it."`
	BackoffMax       string            `json:"backoff_max,omitempty" doc:"The largest retry backoff, when the task sets it."`
	Result           json.RawMessage   `json:"result,omitempty" doc:"The result of a task that succeeded: the JSON value it is, or a JSON string of other text."`
	ResultBase64     []byte            `json:"result_base64,omitempty" doc:"A result that is not text, in base64 (then result is absent)."`
	ScheduledAt      *time.Time        `json:"scheduled_at,omitempty" doc:"When a RETRYING task runs again, when a SCHEDULED one falls due, when a SLEEPING one's sleep ends, or when a WAITING one's wait times out."`
	Transitions      []QueueTransition `json:"transitions,omitempty" doc:"The task's history, oldest first (the first and the last 49 changes)."`
	BudgetWait       *budget.Wait      `json:"budget_wait,omitempty" doc:"Set while a task (PENDING, or RETRYING until its delay ends) waits for its LLM budget: a budget gate deferred it (attempt not counted); which budget, since when, how often, why."`
	WaitingFor       *TaskWait         `json:"waiting_for,omitempty" doc:"What a WAITING task waits for (the signals, or the children it spawned; since when, until when); on a RUNNING task claimed after a wait for a signal, that wait: report it again (wait_signal with its names and until) to be answered what ended it."`
	Parent           string            `json:"parent,omitempty" doc:"The step task that spawned this one, for a child task."`
	ParentStep       int               `json:"parent_step,omitempty" doc:"The step of the parent that spawned this one, for a child task."`
	ParentQueue      string            `json:"parent_queue,omitempty" doc:"The parent's queue, while the parent exists (GET of one task only)."`
	Children         *TaskChildren     `json:"children,omitempty" doc:"For a task whose steps spawned children: counts by state and the first 20 children with their states (GET of one task only; GET .../children pages through the rest)."`
	Signals          []TaskSignal      `json:"signals,omitempty" doc:"The signals the task received, waiting to be consumed (in the order sent) or consumed (GET of one task only)."`
	TraceParent      string            `json:"traceparent,omitempty" doc:"The W3C traceparent of the task's submission (its creation context), when it was traced: a worker's span for an attempt continues it and links to it."`
}

// QueueTaskMetadata is a task's metadata.
type QueueTaskMetadata struct {
	CreatedAt    time.Time `json:"created_at" doc:"When the task was submitted."`
	Priority     int       `json:"priority" doc:"0 to 1000, higher first."`
	SourceSystem string    `json:"source_system,omitempty" doc:"The system the task came from."`
	Tenant       string    `json:"tenant,omitempty" doc:"The tenant the task is for."`
	Budget       string    `json:"budget,omitempty" doc:"The LLM budget the task spends (such as openai/gpt-4.1/key-prod): a worker reserves estimated_tokens of it for the tenant before the task runs, and defers the task, uncharged, while the budget has no room."`
	// EstimatedTokens is what the worker reserves of Budget.
	EstimatedTokens int64 `json:"estimated_tokens,omitempty" doc:"The tokens reserved of budget before the task runs (0 to 1e9); settled with what the handler reports it used."`
}

// QueueTransition is one change of a task's state.
type QueueTransition struct {
	Status  queue.Status `json:"status" doc:"The state entered."`
	At      time.Time    `json:"at" doc:"When."`
	Attempt int          `json:"attempt,omitempty" doc:"The attempt it belongs to."`
	Worker  string       `json:"worker,omitempty" doc:"The worker (or session name) that made it."`
	Error   string       `json:"error,omitempty" doc:"The error of a failure."`
}

// queueTaskOf is t as the API shows it.
func queueTaskOf(t *queue.Task) QueueTask {
	v := queue.NewView(t)
	out := QueueTask{
		ID: t.ID, Type: t.Type, Queue: t.Queue, InputDataURI: t.InputDataURI, OutputDataURI: t.OutputDataURI,
		Parameters: t.Parameters, Status: t.CurrentStatus, Attempt: t.Attempt, Token: t.Token,
		RetriesAttempted: t.RetriesAttempted, MaxRetries: t.Retries(), LastError: t.LastError,
		Result: v.Result, ResultBase64: v.ResultBase64, Parent: t.Parent, ParentStep: t.ParentStep, TraceParent: t.TraceParent,
		Metadata: QueueTaskMetadata{CreatedAt: t.Metadata.CreatedAt, Priority: t.Metadata.Priority, SourceSystem: t.Metadata.SourceSystem, Tenant: t.Metadata.Tenant,
			Budget: t.Metadata.Budget, EstimatedTokens: t.Metadata.EstimatedTokens},
	}
	dur := func(d queue.Duration) string {
		if d == 0 {
			return ""
		}
		return time.Duration(d).String()
	}
	out.Timeout, out.BackoffBase, out.BackoffMax = dur(t.Timeout), dur(t.BackoffBase), dur(t.BackoffMax)
	out.BudgetWait = budget.TaskWait(t)
	if (t.CurrentStatus == queue.Retrying || t.CurrentStatus == queue.Scheduled || t.CurrentStatus == queue.Sleeping) && !t.ScheduledAt.IsZero() {
		at := t.ScheduledAt
		out.ScheduledAt = &at
	}
	if t.CurrentStatus == queue.Running && t.WaitingFor != nil && len(t.WaitingFor.Signals) > 0 {
		out.WaitingFor = taskWaitOf(t.WaitingFor) // claimed, woken from this wait: report it again to get what woke it
	}
	if t.CurrentStatus == queue.Waiting {
		out.WaitingFor = taskWaitOf(t.WaitingFor)
		if !t.ScheduledAt.IsZero() && t.ScheduledAt.Before(queue.NoTimeout) {
			at := t.ScheduledAt // its due time in the wait index
			out.ScheduledAt = &at
		}
	}
	for _, tr := range t.Transitions {
		out.Transitions = append(out.Transitions, QueueTransition(tr))
	}
	return out
}

// queueTasksOf is ts as the API shows them (never nil).
func queueTasksOf(ts []*queue.Task) []QueueTask {
	out := make([]QueueTask, len(ts))
	for i, t := range ts {
		out[i] = queueTaskOf(t)
	}
	return out
}

// SubmitResult is what a submission did: the same as drover submit --json.
type SubmitResult struct {
	Submitted  int               `json:"submitted" doc:"Tasks stored."`
	Duplicates int               `json:"duplicates" doc:"Tasks whose id was stored already (the same task): left as they were."`
	Rejected   []queue.LineError `json:"rejected" doc:"The tasks that were not valid, by line (NDJSON) or 1-based position (array), with why; the others went in."`
}

// TaskPage is one page of a listing.
type TaskPage struct {
	Tasks []QueueTask `json:"tasks" doc:"The tasks of the page."`
	Next  string      `json:"next,omitempty" doc:"Pass as after for the next page; absent on the last page."`
}

// QueueStats counts a queue's tasks by status.
type QueueStats struct {
	Queue     string `json:"queue" doc:"The queue."`
	Pending   int64  `json:"pending" doc:"Waiting to be claimed."`
	Running   int64  `json:"running" doc:"Claimed by a worker."`
	Retrying  int64  `json:"retrying" doc:"Failed, waiting for their next attempt."`
	Succeeded int64  `json:"succeeded" doc:"Finished with a result (those past their retention included)."`
	Dead      int64  `json:"dead" doc:"In the dead-letter queue."`
	Cancelled int64  `json:"cancelled" doc:"Cancelled."`
	Scheduled int64  `json:"scheduled" doc:"Submitted to run later (run_at or delay), their time not come yet."`
	Paused    bool   `json:"paused" doc:"Whether the queue is paused: it takes submissions, but no worker claims its tasks until it is resumed."`
	Sleeping  int64  `json:"sleeping" doc:"Step tasks parked until the sleep their last step ended with is over."`
	Waiting   int64  `json:"waiting" doc:"Step tasks parked until a signal they wait for comes or their wait times out."`
}

// BulkResult is what a change of many tasks did.
type BulkResult struct {
	Queue  string `json:"queue" doc:"The queue."`
	Status string `json:"status" doc:"The status of the tasks changed."`
	Action string `json:"action" enum:"requeued,purged" doc:"What was done."`
	Count  int    `json:"count" doc:"How many tasks it was done to."`
}

// SubmittedTask is a task as a submission gives it (the OpenAPI document's
// description; the server reads it with the queue package's own rules:
// unknown fields are refused).
type SubmittedTask struct {
	ID            string             `json:"task_id" doc:"The task's id: required, unique across queues; submitting the same task again is safe."`
	Type          string             `json:"task_type" doc:"The task's type."`
	InputDataURI  string             `json:"input_data_uri,omitempty" doc:"Where the task's input is."`
	OutputDataURI string             `json:"output_data_uri,omitempty" doc:"Where the task's output goes."`
	Parameters    json.RawMessage    `json:"parameters,omitempty" doc:"Any JSON value; with the metadata, at most 64 KiB."`
	Metadata      *QueueTaskMetadata `json:"metadata,omitempty" doc:"Priority (0 to 1000, higher first), source_system, tenant."`
	MaxRetries    *int               `json:"max_retries,omitempty" minimum:"0" maximum:"100" doc:"The retry budget; default 3."`
	Timeout       string             `json:"timeout,omitempty" doc:"What one attempt may take (Go duration, or seconds)."`
	BackoffBase   string             `json:"backoff_base,omitempty" doc:"The first retry's backoff bound."`
	BackoffMax    string             `json:"backoff_max,omitempty" doc:"The largest retry backoff."`
	RunAt         *time.Time         `json:"run_at,omitempty" doc:"Run the task at this time (RFC 3339), not before: SCHEDULED until then. A time in the past means now; at most 100 years ahead. Not with delay."`
	Delay         string             `json:"delay,omitempty" doc:"Run the task after this long (Go duration such as 10m, or seconds), not before: SCHEDULED until then. Not negative; not with run_at."`
	TraceParent   string             `json:"traceparent,omitempty" doc:"The W3C traceparent each attempt's span continues (00-<32 hex>-<16 hex>-<2 hex>); by default, when the server traces, the request's traceparent header, through the server's span."`
}

var reflectTaskInput = reflect.TypeFor[SubmittedTask]()
