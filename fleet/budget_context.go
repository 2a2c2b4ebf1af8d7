package fleet

import (
	"context"
	"net/http"

	"github.com/droverhq/drover/queue"
)

// usageKey is the context key of the task a fleet worker's handler runs,
// for ReportUsage.
type usageKey struct{}

// usageSlot is what a handler's context carries for ReportUsage.
type usageSlot struct {
	g *BudgetGate
	t *queue.Task
}

// withUsageContext returns h with its context carrying the gate and the
// task, for ReportUsage, and the usage field of its result read when it
// reported none (usedFromResult); nil for nil.
func (g *BudgetGate) withUsageContext(h queue.Handler) queue.Handler {
	if h == nil {
		return nil
	}
	return func(ctx context.Context, t *queue.Task) ([]byte, error) {
		out, err := h(context.WithValue(ctx, usageKey{}, usageSlot{g: g, t: t}), t)
		if err == nil {
			g.usedFromResult(t, out)
		}
		return out, err
	}
}

// ReportUsage records, from the context of a handler that a Worker runs,
// the LLM tokens its task used and the provider's response headers h
// (nil: none), as Budgets().UsedWithHeaders does with the task: the
// settle after the handler returns counts tokens instead of the estimate
// and passes h's x-ratelimit-remaining-tokens and x-ratelimit-reset-tokens.
// A handler deep in a call stack needs only its context. It returns false
// when ctx is not a Worker handler's (nothing is recorded); a task without
// a budget ignores the report, as UsedWithHeaders does.
func ReportUsage(ctx context.Context, tokens int64, h http.Header) bool {
	s, ok := ctx.Value(usageKey{}).(usageSlot)
	if !ok {
		return false
	}
	s.g.UsedWithHeaders(s.t, tokens, h)
	return true
}
