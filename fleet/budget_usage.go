package fleet

import (
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/queue"
)

// usedFromResult records the usage t's result carries (budget.ResultUsage:
// {"usage": {"total_tokens": N}} and the like) as what its handler used,
// unless the handler reported its usage itself (Used, UsedWithHeaders,
// ReportUsage, drover usage), which wins. A usage the result gets wrong is
// logged and the estimate settled.
func (g *BudgetGate) usedFromResult(t *queue.Task, result []byte) {
	if t.Metadata.Budget == "" || len(result) == 0 {
		return
	}
	key := usedKey(t)
	g.mu.Lock()
	rep, ok := g.used[key]
	g.mu.Unlock()
	if !ok || rep.tokens >= 0 {
		return
	}
	tokens, found, err := budget.ResultUsage(result)
	if err != nil {
		g.logger.Warn("budget: the result's usage is not usable; its estimate is settled", "budget", t.Metadata.Budget, "task", t.ID, "err", err)
		return
	}
	if !found {
		return
	}
	g.mu.Lock()
	if rep, ok := g.used[key]; ok && rep.tokens < 0 {
		g.used[key] = report{tokens: tokens}
	}
	g.mu.Unlock()
}
