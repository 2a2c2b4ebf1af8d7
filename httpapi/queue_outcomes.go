package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
)

// OutcomeInput is one outcome of a batch: a success (with its result) or,
// with error, a failure.
type OutcomeInput struct {
	TaskID    string          `json:"task_id" minLength:"1" maxLength:"128" doc:"The task."`
	Token     int64           `json:"token" minimum:"1" doc:"The token the claim returned with the task."`
	OK        *bool           `json:"ok,omitempty" doc:"True for a success (the default without error); false requires error."`
	Result    json.RawMessage `json:"result,omitempty" doc:"A success's result: any JSON value, at most 256 KiB."`
	Error     string          `json:"error,omitempty" maxLength:"65536" doc:"A failure: what went wrong (kept in the task's history, the first 4 KiB)."`
	Permanent bool            `json:"permanent,omitempty" doc:"A failure that retrying cannot help: the task goes to the dead-letter queue at once."`
	// SleepFor and SleepUntil park the task instead.
	SleepFor   string `json:"sleep_for,omitempty" maxLength:"64" doc:"Neither a success nor a failure: the task sleeps this long (a duration such as 10m, or seconds), SLEEPING with no claim, and is claimed again, its attempt not counted, when the sleep ends."`
	SleepUntil string `json:"sleep_until,omitempty" maxLength:"64" doc:"As sleep_for, until this RFC 3339 time with its zone."`
	// Streamed asks for the stream's end, as the single ack and fail do.
	Streamed bool `json:"streamed,omitempty" doc:"This attempt wrote events to the task's stream: once the outcome is stored, the server ends the stream with done (the task ended) or attempt_ended (it will be retried or sleeps). Without it a task that ended leaves its stream without done, and followers end on its status instead."`
}

type outcomesInput struct {
	Queue string `path:"queue" minLength:"1" maxLength:"128" doc:"The queue's name."`
	Body  struct {
		Session  string         `json:"session" pattern:"^[0-9a-f]{1,16}\\.[a-z2-7]{16,64}$" doc:"The session the tasks were claimed under."`
		Outcomes []OutcomeInput `json:"outcomes" minItems:"1" maxItems:"256" doc:"The outcomes, one per claimed task, of one claim or several."`
		Claim    *NextClaim     `json:"claim,omitempty" doc:"Claim more tasks under the same session once the outcomes are written, and answer them in tasks: a worker's next claim, without a request of its own."`
	}
}

// NextClaim is a claim made with a batch of outcomes, after them.
type NextClaim struct {
	Max  int    `json:"max,omitempty" minimum:"1" maximum:"100" doc:"The most tasks to claim; default 1."`
	Wait string `json:"wait,omitempty" doc:"How long to wait for a task when none is claimable (Go duration), capped by the server's longest wait; without it one attempt is made."`
}

// OutcomeResult is how one outcome of a batch went.
type OutcomeResult struct {
	TaskID string `json:"task_id" doc:"The task."`
	// Status is the HTTP status the outcome alone would have had.
	Status      int          `json:"status" doc:"200: recorded; 409: the claim no longer holds (nothing written; the task runs, or ran, elsewhere); 404: no such task in the queue; 5xx: not recorded, try again."`
	TaskStatus  queue.Status `json:"current_status,omitempty" enum:"SUCCEEDED,RETRYING,SLEEPING,DEAD" doc:"The task's state the outcome left it in (on 200)."`
	Attempt     int          `json:"attempt,omitempty" doc:"The attempt the outcome ended (on 200)."`
	ScheduledAt *time.Time   `json:"scheduled_at,omitempty" doc:"When a RETRYING task runs again, or a SLEEPING one's sleep ends."`
	Detail      string       `json:"detail,omitempty" doc:"Why the outcome was not recorded."`
}

// OutcomesResult is the answer to a batch of outcomes, in their order.
type OutcomesResult struct {
	Results []OutcomeResult `json:"results" doc:"One per outcome sent, in order."`
	// Tasks and ClaimError answer the claim sent with the outcomes.
	Tasks      []QueueTask `json:"tasks,omitempty" doc:"With claim: the tasks claimed after the outcomes, RUNNING, each with its attempt and token (absent: none came within the wait)."`
	ClaimError string      `json:"claim_error,omitempty" doc:"With claim: why no task was claimed when the claim itself failed (the outcomes were written all the same); claim again."`
}

// outcomesRoute registers the batch outcome route.
func (s *Server) outcomesRoute(tags []string) {
	huma.Register(s.api, huma.Operation{
		OperationID: "report-outcomes", Method: http.MethodPost, Path: "/v1/queues/{queue}/outcomes", Tags: tags,
		Summary: "Report the outcomes of claimed tasks, in one request",
		Description: "Acks and fails many claimed tasks at once (of one claim or several), as a Go worker writes them: the " +
			"outcomes of one claim in one transaction fenced by its token. Each outcome is answered apart, in order, with " +
			"the status it alone would have had: a stale token (409) or an unknown task (404) does not fail the others. " +
			"The same task and token twice in one request count once: the first (the second gets 409). Bad input anywhere " +
			"is a 400, and then nothing is written. With claim, the same session then claims more tasks, answered in " +
			"tasks: one request per batch of a worker's work instead of two.",
	}, s.reportOutcomes)
}

func (s *Server) reportOutcomes(ctx context.Context, in *outcomesInput) (*struct{ Body OutcomesResult }, error) {
	err := checkQueue(in.Queue)
	if err != nil {
		return nil, err
	}
	var wait time.Duration
	if nc := in.Body.Claim; nc != nil {
		if wait, err = s.wait("body.claim.wait", nc.Wait); err != nil {
			return nil, err
		}
	}
	lid, err := s.sessionLease(ctx, "body.session", in.Body.Session)
	if err != nil {
		return nil, err
	}
	os := make([]queue.Outcome, len(in.Body.Outcomes))
	for i, o := range in.Body.Outcomes {
		failed := o.Error != ""
		switch {
		case o.OK != nil && *o.OK == failed:
			return nil, invalid("body.outcomes["+strconv.Itoa(i)+"].ok", *o.OK, "must be true for a success, false (or absent) with error")
		case failed && len(o.Result) > 0:
			return nil, invalid("body.outcomes["+strconv.Itoa(i)+"].result", nil, "must be absent from a failure")
		}
		os[i] = queue.Outcome{Held: queue.Held{Queue: in.Queue, ID: o.TaskID, Token: o.Token, Lease: lid},
			Failed: failed, Error: o.Error, Permanent: o.Permanent}
		if os[i].SleepUntil, err = outcomeSleep(i, o); err != nil {
			return nil, err
		}
		if len(o.Result) > 0 && string(o.Result) != "null" {
			os[i].Result = o.Result
		}
	}
	c, err := s.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	rs, err := c.Report(ctx, os)
	var ie *drover.InputError
	if errors.As(err, &ie) && strings.HasPrefix(ie.Field, "outcomes[") {
		return nil, problem(err, map[string]string{ie.Field: "body." + ie.Field})
	}
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	out := OutcomesResult{Results: make([]OutcomeResult, len(rs))}
	for i, r := range rs {
		out.Results[i] = outcomeResultOf(os[i].ID, r)
	}
	s.endStreams(ctx, in.Body.Outcomes, os, rs)
	if nc := in.Body.Claim; nc != nil {
		tasks, err := s.claimFor(ctx, in.Queue, in.Body.Session, nc.Max, wait, wait == 0)
		if err != nil {
			out.ClaimError = err.Error()
			var p *Problem
			if errors.As(err, &p) {
				out.ClaimError = p.Detail
			}
		}
		out.Tasks = tasks
	}
	return &struct{ Body OutcomesResult }{out}, nil
}

// endStreams ends the streams of the outcomes in that asked for it and
// were stored, together: their writes share the stream writer's group
// commits, so a batch costs about one flush, not one a task.
func (s *Server) endStreams(ctx context.Context, in []OutcomeInput, os []queue.Outcome, rs []queue.Reported) {
	var wg sync.WaitGroup
	for i, r := range rs {
		if !in[i].Streamed || r.Err != nil || r.Task == nil {
			continue
		}
		wg.Add(1)
		go func(h queue.Held, t *queue.Task, cause string) {
			defer wg.Done()
			s.endStream(ctx, h, t, cause)
		}(os[i].Held, r.Task, os[i].Error)
	}
	wg.Wait()
}

// outcomeSleep reads the sleep outcome o (the i-th) asks for: when it
// ends, now at the earliest (zero: none).
func outcomeSleep(i int, o OutcomeInput) (time.Time, error) {
	if o.SleepFor == "" && o.SleepUntil == "" {
		return time.Time{}, nil
	}
	at := "body.outcomes[" + strconv.Itoa(i) + "]."
	if o.Error != "" || len(o.Result) > 0 || o.OK != nil {
		return time.Time{}, invalid(at+"sleep_for", nil, "must be alone: a task that sleeps neither succeeds (ok, result) nor fails (error)")
	}
	until, err := parseSleep(at, o.SleepFor, o.SleepUntil)
	if err != nil {
		return time.Time{}, err
	}
	if now := time.Now().UTC(); until.Before(now) {
		until = now // a time past: due at once
	}
	return until, nil
}

// outcomeResultOf is r, the outcome of task id, as the API shows it.
func outcomeResultOf(id string, r queue.Reported) OutcomeResult {
	if r.Err != nil {
		res := OutcomeResult{TaskID: id, Status: http.StatusInternalServerError, Detail: r.Err.Error()}
		var p *Problem
		if errors.As(problem(r.Err, queueWhere), &p) {
			res.Status, res.Detail = p.Status, p.Detail
		}
		return res
	}
	t := r.Task
	if t == nil { // never expected: an outcome is answered with a task or an error
		return OutcomeResult{TaskID: id, Status: http.StatusInternalServerError, Detail: "the outcome's fate is unknown: report it again"}
	}
	res := OutcomeResult{TaskID: id, Status: http.StatusOK, TaskStatus: t.CurrentStatus, Attempt: t.Attempt}
	if (t.CurrentStatus == queue.Retrying || t.CurrentStatus == queue.Sleeping) && !t.ScheduledAt.IsZero() {
		at := t.ScheduledAt
		res.ScheduledAt = &at
	}
	return res
}
