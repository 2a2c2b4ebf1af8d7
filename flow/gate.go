package flow

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/droverhq/drover"
)

// Gate admits calls before they run: a rate limit, a concurrency quota or a
// circuit breaker. A queue worker takes gates through an adapter (package
// fleet); any other caller may use them directly.
type Gate interface {
	// Admit returns once c may run, with done to be called with the error
	// the call ended with (nil: success; see Call.Outcome), or a nil done
	// when the gate does not apply to c. It returns ctx's error when ctx
	// ends first, or a *DeferError when c should be tried again later.
	Admit(ctx context.Context, c Call) (done func(err error), err error)
}

// Call is one unit of work a gate admits: a queued task's run, or an
// agent's call to a resource. It holds what the gates read, nothing more.
type Call struct {
	// ID names the call: a breaker's half-open probe is the call of this
	// id.
	ID string
	// Type is the call's kind (a task type): gates given types apply to
	// calls of those types only, and quota "type" counts per Type.
	Type string
	// Tenant is whom the call is for: quota "tenant" counts per Tenant, and
	// a call without one is not limited by it.
	Tenant string
	// Outcome reads the error a done hears; nil reads it with
	// DefaultOutcome.
	Outcome func(err error) Outcome
}

// outcomes returns how c's errors are read.
func (c Call) outcomes() func(error) Outcome {
	if c.Outcome == nil {
		return DefaultOutcome
	}
	return c.Outcome
}

// Outcome is what the end of a call says to the gates that admitted it.
type Outcome int

const (
	// Succeeded: the call ran and succeeded.
	Succeeded Outcome = iota
	// Failed: the call ran and failed in a way that may be the resource's
	// fault (a transient error, a timeout); a breaker counts it.
	Failed
	// Inconclusive: the call ran, or began to, but its end says nothing
	// about the resource (a permanent failure is the input's fault; a
	// cancelled call did not finish); a breaker counts nothing, a rate
	// limit keeps its token.
	Inconclusive
	// NotRun: a later gate refused the call, which never started; a rate
	// limit takes its token back, a breaker counts nothing.
	NotRun
)

// String names the outcome.
func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	case Inconclusive:
		return "inconclusive"
	case NotRun:
		return "not run"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// DefaultOutcome reads nil as Succeeded, a cancelled context as
// Inconclusive and any other error as Failed.
func DefaultOutcome(err error) Outcome {
	switch {
	case err == nil:
		return Succeeded
	case errors.Is(err, context.Canceled):
		return Inconclusive
	}
	return Failed
}

// ErrDeferred matches every *DeferError.
var ErrDeferred = drover.ErrDeferred

// DeferError refuses a call for now: try it again after After. It is
// drover.DeferError, the one deferral of every part: a queue worker hands
// the task back for that long without counting the attempt.
type DeferError = drover.DeferError

// RateGate admits each call of the given types (every type when none) once
// it holds one token of l: a limit counted in requests. Calls whose cost is
// a weight (LLM tokens) reserve and settle through the Limiter themselves.
func RateGate(l *Limiter, types ...string) Gate { return &rateGate{l: l, types: types} }

type rateGate struct {
	l     *Limiter
	types []string
}

func (g *rateGate) Admit(ctx context.Context, c Call) (func(error), error) {
	if len(g.types) > 0 && !slices.Contains(g.types, c.Type) {
		return nil, nil
	}
	r, err := g.l.Reserve(ctx, 1)
	if err != nil {
		return nil, err
	}
	outcome := c.outcomes()
	return func(err error) {
		if outcome(err) == NotRun {
			r.Settle(0) // a later gate refused the call: the token goes back
			return
		}
		r.Settle(1)
	}, nil
}
