package httpapi_test

import (
	"strings"
	"testing"
)

// TestQueueHistoryRefusals: the history of a queue nothing was submitted
// to is a 404 problem that says so, and a queue name outside the rule a
// 400 problem naming path.queue; both come from the queue/history
// package's own checks.
func TestQueueHistoryRefusals(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	r := a.do("GET", "/v1/queues/never-submitted/history", nil).problem(t, 404)
	if !strings.Contains(r.str("detail"), "nothing was ever submitted") {
		t.Errorf("404 detail %q does not say nothing was submitted", r.str("detail"))
	}
	r = a.do("GET", "/v1/queues/bad%20name/history?window=24h", nil).problem(t, 400)
	errs, _ := r.JSON["errors"].([]any)
	if len(errs) == 0 || errs[0].(map[string]any)["location"] != "path.queue" {
		t.Errorf("problem does not name path.queue: %s", r.Raw)
	}
}
