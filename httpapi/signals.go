package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/danielgtaylor/huma/v2"
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
	Since   time.Time  `json:"since" doc:"When the wait began."`
	Until   *time.Time `json:"until,omitempty" doc:"When the wait times out: the next step then runs with a timeout instead of a signal. Absent: no timeout."`
	// Children is set for a wait for the children a step spawned.
	Children *TaskChildrenWait `json:"children,omitempty" doc:"For a task that waits for the children a step spawned: which step, how many it spawned, how many must end."`
}

// TaskChildrenWait is a wait for the children a step spawned.
type TaskChildrenWait struct {
	Step    int  `json:"step" doc:"The step that spawned them."`
	N       int  `json:"n" doc:"How many it spawned."`
	Wait    int  `json:"wait" doc:"How many must end before the next step runs."`
	Collect bool `json:"collect,omitempty" doc:"Every outcome is collected; otherwise the first child that ends DEAD or CANCELLED fails the task."`
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

// signalRoutes registers the route that sends a task a signal.
func (s *Server) signalRoutes() {
	huma.Register(s.api, huma.Operation{
		OperationID: "send-task-signal", Method: http.MethodPost, Path: "/v1/tasks/{id}/signals/{name}", Tags: []string{"queues"},
		Summary: "Send a task a signal: a step that waits for it (human approval, a reply) resumes with its data",
		Description: "Stores the signal in the task's inbox until a step that waits for it consumes it; when the task is parked " +
			"WAITING for it, the same transaction makes it PENDING and a worker resumes it. A signal sent before the task waits " +
			"is kept for the wait. The same name and idempotency key sent again is stored and delivered once. 404 for an " +
			"unknown task, 409 for a finished one (SUCCEEDED, DEAD, CANCELLED), 400 for a bad name, key or data.",
		DefaultStatus: http.StatusAccepted,
		Errors:        []int{http.StatusBadRequest, http.StatusNotFound, http.StatusConflict},
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
