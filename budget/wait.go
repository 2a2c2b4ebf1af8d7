package budget

import (
	"strings"
	"time"

	"github.com/droverhq/drover/queue"
)

// Wait says that a queue task waits for a budget: a worker's budget gate
// deferred it (handed it back without counting an attempt) and it has not
// run since.
type Wait struct {
	// Budget is the budget's key.
	Budget string `json:"budget" doc:"The budget the task waits for."`
	// Since is when the gate first deferred it in this run of deferrals.
	Since time.Time `json:"since" doc:"When a budget gate first deferred it, of the deferrals in a row."`
	// Deferrals is the deferrals in a row.
	Deferrals int `json:"deferrals" doc:"The times in a row it was deferred."`
	// Next is when it is tried again (zero: not known).
	Next *time.Time `json:"next,omitempty" doc:"When it is tried again."`
	// Reason is the first deferral's reason.
	Reason string `json:"reason" doc:"Why it waits, as the first deferral said."`
}

// UnconfiguredLabel is the budget label of the metrics of work that names
// a budget nobody configured (drover_budget_task_deferrals_total): one
// series for all such keys, which come from tasks' metadata and are not
// bounded. No budget key can be it (keys have no parentheses).
const UnconfiguredLabel = "(unconfigured)"

// deferredPrefix is how the queue records a deferral in a task's history,
// and waitPrefix how a budget gate's reasons begin.
const (
	deferredPrefix = "deferred: "
	waitPrefix     = "budget "
)

// WaitReason is the deferral reason of a task that waits for budget key:
// "budget KEY: why". TaskWait reads it back.
func WaitReason(key, why string) string { return waitPrefix + key + ": " + why }

// NotConfigured is why a task waits for budget key nobody configured, as
// a gate's deferral says it (after WaitReason's "budget KEY: ").
func NotConfigured(key string) string {
	return "not configured (drover budgets set " + key + " --tokens N)"
}

// DeferralLabel is the budget label under which a deferral with reason
// counts in drover_budget_task_deferrals_total, for a task whose metadata
// names budget taskBudget: the key, or UnconfiguredLabel when it says the
// budget is not configured (NotConfigured). false: the reason is not a
// wait for that budget (WaitReason).
func DeferralLabel(reason, taskBudget string) (string, bool) {
	rest, ok := strings.CutPrefix(reason, waitPrefix)
	if !ok {
		return "", false
	}
	key, why, ok := strings.Cut(rest, ": ")
	switch {
	case !ok || key != taskBudget || CheckKey(key) != nil:
		return "", false
	case why == NotConfigured(key):
		return UnconfiguredLabel, true
	}
	return key, true
}

// TaskWait returns what budget t waits for, or nil when it does not wait
// for one: t is PENDING (RETRYING while its delay runs) after deferrals in a row, the first of which a
// budget gate recorded (WaitReason; a refusal of Reserve says the same).
func TaskWait(t *queue.Task) *Wait {
	if t == nil || (t.CurrentStatus != queue.Pending && t.CurrentStatus != queue.Retrying) || t.Deferrals == 0 {
		return nil
	}
	for i := len(t.Transitions) - 1; i >= 0; i-- {
		tr := t.Transitions[i]
		if tr.Status != queue.Pending || !strings.HasPrefix(tr.Error, deferredPrefix) {
			continue
		}
		reason := strings.TrimPrefix(tr.Error, deferredPrefix)
		rest, ok := strings.CutPrefix(reason, waitPrefix)
		if !ok {
			return nil // deferred by another gate
		}
		key, _, ok := strings.Cut(rest, ": ")
		if !ok || CheckKey(key) != nil || key != t.Metadata.Budget {
			return nil
		}
		w := &Wait{Budget: key, Since: tr.At, Deferrals: t.Deferrals, Reason: reason}
		if !t.ScheduledAt.IsZero() {
			next := t.ScheduledAt
			w.Next = &next
		}
		return w
	}
	return nil
}
