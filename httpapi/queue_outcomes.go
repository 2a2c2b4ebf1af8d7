package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
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
	// Defer hands the task back for later, uncharged, as a Go worker's gate does.
	Defer *OutcomeDefer `json:"defer,omitempty" doc:"Neither a success nor a failure: the task was not run and waits (its LLM budget has no room, a quota is full): it goes back PENDING, its attempt not counted, to be claimed again after after, as a Go worker hands back a task its budget gate or flow control deferred (drover.DeferError). Its history says deferred: and the reason; deferrals in a row double the delay (16 times at most, 30 s past after at most) and only the first is written to the history. A reason budget KEY: why (KEY the task's metadata.budget) makes tasks get show budget_wait and counts drover_budget_task_deferrals_total."`
	// WaitSignal ends the attempt with a wait for a signal instead.
	WaitSignal *OutcomeWait `json:"wait_signal,omitempty" doc:"Neither a success nor a failure: wait for the first of these signals (POST /v1/tasks/{id}/signals/{name}). A signal that waits in the task's inbox already (sent before the wait), other than those received_signals names, is answered at once in signal, not consumed, with the task still claimed (RUNNING, same token): run on with it, and name it in received_signals of every later outcome of this claim. So is the timeout of a wait whose until passed (signal.timed_out). Otherwise the task parks WAITING with no claim, its attempt not counted, until a signal named is sent or the timeout passes; it is then claimed again, showing waiting_for: report the same wait (until: waiting_for.until) to be answered the signal or the timeout."`
	// ReceivedSignals names the signals waits answered under this claim.
	ReceivedSignals []SignalRef `json:"received_signals,omitempty" maxItems:"64" doc:"The signals the waits of this claim were answered with so far (each answer's signal name and idempotency_key; not timeouts). A success, or a wait that parks (the next claim resumes at that wait), consumes those still in the inbox in its own transaction, fenced by the claim: a claim that no longer holds consumes nothing, and a worker that dies before its outcome leaves them to the next claim, which is answered them again. Any other outcome (a retried failure, a sleep, a failure to the dead-letter queue, a wait handed back) consumes nothing, and the task's next claim (after a requeue, for a dead one) resumes where this one did: at the wait it was claimed after (waiting_for), or from the start; it need not name them. A wait answered at once consumes nothing and skips them."`
	// Streamed asks for the stream's end, as the single ack and fail do.
	Streamed bool `json:"streamed,omitempty" doc:"This attempt wrote events to the task's stream: once the outcome is stored, the server ends the stream with done (the task ended) or attempt_ended (it will be retried, sleeps, parks waiting for a signal or is deferred). Without it a task that ended leaves its stream without done, and followers end on its status instead."`
}

// SignalRef names a signal a task received.
type SignalRef struct {
	Name           string `json:"name" minLength:"1" maxLength:"128" doc:"The signal's name."`
	IdempotencyKey string `json:"idempotency_key" minLength:"1" maxLength:"128" doc:"The idempotency key it was sent with, as the answer's signal says."`
}

// OutcomeDefer hands a claimed task back unrun for later.
type OutcomeDefer struct {
	After  string `json:"after" maxLength:"64" doc:"How long the task waits before it is claimed again: a duration such as 30s, or seconds (0 to 24h)."`
	Reason string `json:"reason" minLength:"1" maxLength:"1024" doc:"Why it waits, kept in its history. A task that waits for its LLM budget says budget KEY: why, as the budget's reserve answered (the detail of its 429), or budget KEY: not configured (drover budgets set KEY --tokens N) after a 404."`
}

// OutcomeWait is a wait for a signal that ends an attempt.
type OutcomeWait struct {
	Names   []string `json:"names" minItems:"1" maxItems:"16" doc:"The signals waited for: the first of them sent ends the wait."`
	Timeout string   `json:"timeout,omitempty" maxLength:"64" doc:"How long to wait at most (a duration such as 24h, or seconds); absent (and no until): no timeout."`
	Until   string   `json:"until,omitempty" maxLength:"64" doc:"As timeout, until this RFC 3339 time with its zone: to resume a wait a claim shows in waiting_for, give its until."`
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
	TaskStatus  queue.Status `json:"current_status,omitempty" enum:"SUCCEEDED,RETRYING,SLEEPING,WAITING,PENDING,RUNNING,DEAD" doc:"The task's state the outcome left it in (on 200): RUNNING when a wait_signal was answered at once (signal), still claimed."`
	Attempt     int          `json:"attempt,omitempty" doc:"The attempt the outcome ended (on 200)."`
	ScheduledAt *time.Time   `json:"scheduled_at,omitempty" doc:"When a RETRYING task runs again, a SLEEPING one's sleep ends, or a deferred (PENDING) one is claimable again."`
	Detail      string       `json:"detail,omitempty" doc:"Why the outcome was not recorded."`
	// Signal answers a wait_signal at once.
	Signal *Signal `json:"signal,omitempty" doc:"A wait_signal answered at once: the first signal waited for in the inbox (not consumed: name it in received_signals of the claim's later outcomes, and the one that ends the attempt consumes it), or timed_out. The task is still claimed under the same token: its handler runs on with it, and reports another outcome."`
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
		if os[i].Wait, err = outcomeWait(i, o); err != nil {
			return nil, err
		}
		if os[i].Defer, err = outcomeDefer(i, o); err != nil {
			return nil, err
		}
		if len(o.Result) > 0 && string(o.Result) != "null" {
			os[i].Result = o.Result
		}
		for _, r := range o.ReceivedSignals {
			os[i].Received = append(os[i].Received, queue.SignalRef{Name: r.Name, IdempotencyKey: r.IdempotencyKey})
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
	countBudgetDeferrals(os, rs)
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
		}(os[i].Held, r.Task, endCause(os[i]))
	}
	wg.Wait()
}

// endCause is why outcome o ended its attempt, as its stream's end says:
// its error, or its deferral's reason.
func endCause(o queue.Outcome) string {
	if o.Defer != nil {
		return o.Defer.Reason
	}
	return o.Error
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

// outcomeDefer reads the deferral outcome o (the i-th) asks for (nil:
// none).
func outcomeDefer(i int, o OutcomeInput) (*drover.DeferError, error) {
	d := o.Defer
	if d == nil {
		return nil, nil
	}
	at := "body.outcomes[" + strconv.Itoa(i) + "].defer"
	if o.Error != "" || len(o.Result) > 0 || o.OK != nil || o.SleepFor != "" || o.SleepUntil != "" || o.WaitSignal != nil {
		return nil, invalid(at, nil, "must be alone: a task handed back neither succeeds (ok, result), fails (error), sleeps (sleep_for, sleep_until) nor waits (wait_signal)")
	}
	return deferOf(at, d)
}

// deferOf reads deferral d sent at field at: its delay and reason.
func deferOf(at string, d *OutcomeDefer) (*drover.DeferError, error) {
	sl, err := task.ParseSleep(at+".after", d.After)
	if err != nil || !sl.Until.IsZero() || sl.For < 0 || sl.For > queue.MaxDeferAfter {
		return nil, invalid(at+".after", d.After, "must be a duration from 0 to 24h such as 30s, or a number of seconds")
	}
	if strings.TrimSpace(d.Reason) == "" {
		return nil, invalid(at+".reason", d.Reason, "must say why the task waits")
	}
	return &drover.DeferError{Reason: d.Reason, After: sl.For}, nil
}

// deferHeld hands the claimed task h back unrun for d, as a deferral in
// the batch route: the single ack and fail routes' defer.
func (s *Server) deferHeld(ctx context.Context, c *queue.Client, h queue.Held, d *drover.DeferError) (*queueTaskOutput, error) {
	os := []queue.Outcome{{Held: h, Defer: d}}
	rs, err := c.Report(ctx, os)
	if err == nil && rs[0].Err != nil {
		err = rs[0].Err
	}
	if err == nil && rs[0].Task == nil { // never expected
		err = errors.New("the outcome's fate is unknown: report it again")
	}
	if err != nil {
		return nil, problem(err, queueWhere)
	}
	countBudgetDeferrals(os, rs)
	s.endStream(ctx, h, rs[0].Task, d.Reason)
	return &queueTaskOutput{queueTaskOf(rs[0].Task)}, nil
}

// countBudgetDeferrals counts the deferrals written among os (answered
// rs) that wait for their task's budget, as a Go worker's budget gate
// counts its own (drover_budget_task_deferrals_total).
func countBudgetDeferrals(os []queue.Outcome, rs []queue.Reported) {
	for i, r := range rs {
		if os[i].Defer == nil || r.Err != nil || r.Task == nil {
			continue
		}
		if label, ok := budget.DeferralLabel(os[i].Defer.Reason, r.Task.Metadata.Budget); ok {
			metrics.BudgetTaskDeferrals.WithLabelValues(label).Inc()
		}
	}
}

// outcomeWait reads the wait for a signal outcome o (the i-th) asks for
// (nil: none).
func outcomeWait(i int, o OutcomeInput) (*task.Wait, error) {
	ws := o.WaitSignal
	if ws == nil {
		return nil, nil
	}
	at := "body.outcomes[" + strconv.Itoa(i) + "].wait_signal"
	if o.Error != "" || len(o.Result) > 0 || o.OK != nil || o.SleepFor != "" || o.SleepUntil != "" {
		return nil, invalid(at, nil, "must be alone: a task that waits neither succeeds (ok, result), fails (error) nor sleeps (sleep_for, sleep_until)")
	}
	req := &task.WaitRequest{Signals: ws.Names}
	if err := req.Check(); err != nil {
		return nil, problem(err, map[string]string{"signal name": at + ".names", "wait signals": at + ".names"})
	}
	now := time.Now().UTC()
	w := req.Begin(now)
	switch {
	case ws.Timeout != "" && ws.Until != "":
		return nil, invalid(at+".until", ws.Until, "give timeout or until, not both")
	case ws.Timeout != "":
		sl, err := task.ParseSleep(at+".timeout", ws.Timeout)
		if err == nil && (!sl.Until.IsZero() || sl.For <= 0) {
			err = &drover.InputError{Field: at + ".timeout", Value: ws.Timeout, Rule: "must be a duration above 0 such as 24h, or a number of seconds"}
		}
		if err != nil {
			return nil, problem(err, nil)
		}
		w.Until = now.Add(sl.For)
	case ws.Until != "":
		until, err := time.Parse(time.RFC3339Nano, ws.Until)
		if err != nil {
			return nil, invalid(at+".until", ws.Until, "must be an RFC 3339 time with its zone, such as 2026-12-01T09:00:00Z")
		}
		w.Until = until.UTC()
	}
	if w.Until.After(now.AddDate(task.MaxSleepYears, 0, 0)) {
		field, value := at+".until", ws.Until
		if ws.Timeout != "" {
			field, value = at+".timeout", ws.Timeout
		}
		return nil, invalid(field, value, fmt.Sprintf("must end at most %d years from now", task.MaxSleepYears))
	}
	return w, nil
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
	res := OutcomeResult{TaskID: id, Status: http.StatusOK, TaskStatus: t.CurrentStatus, Attempt: t.Attempt, Signal: signalOf(r.Signal)}
	if (t.CurrentStatus == queue.Retrying || t.CurrentStatus == queue.Sleeping || t.CurrentStatus == queue.Waiting || t.CurrentStatus == queue.Pending) &&
		!t.ScheduledAt.IsZero() && t.ScheduledAt.Before(queue.NoTimeout) {
		at := t.ScheduledAt
		res.ScheduledAt = &at
	}
	return res
}
