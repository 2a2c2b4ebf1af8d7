package flow

import (
	"context"
	"errors"
	"slices"

	"github.com/droverhq/drover/queue"
)

// RateGate admits each task of the given types (every type when none) once
// it holds one token of l: a limit counted in requests. Tasks whose cost is
// a weight (LLM tokens) reserve and settle through the Limiter themselves.
func RateGate(l *Limiter, types ...string) queue.Gate { return &rateGate{l: l, types: types} }

type rateGate struct {
	l     *Limiter
	types []string
}

func (g *rateGate) Admit(ctx context.Context, t *queue.Task) (func(error), error) {
	if len(g.types) > 0 && !slices.Contains(g.types, t.Type) {
		return func(error) {}, nil
	}
	r, err := g.l.Reserve(ctx, 1)
	if err != nil {
		return nil, err
	}
	return func(err error) {
		if errors.Is(err, queue.ErrNotRun) {
			r.Settle(0) // a later gate refused the task: the token goes back
			return
		}
		r.Settle(1)
	}, nil
}
