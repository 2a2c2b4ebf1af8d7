package ui_test

import (
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestUIRunNow: on the queue page's SCHEDULED tab, a task's Run now
// button (after its confirmation) makes it due at once, and a worker
// claims it; Run selected now moves the checked task, Run all now the
// rest. The page lists SLEEPING and WAITING tabs too.
func TestUIRunNow(t *testing.T) {
	s := newSite(t)
	tasks := []map[string]any{}
	for _, id := range []string{"r1", "r2", "r3", "r4"} {
		tasks = append(tasks, map[string]any{"task_id": id, "task_type": "email", "delay": "1h"})
	}
	s.do("POST", "/v1/queues/later/tasks", tasks, 200)
	counts := func() (scheduled, pending float64) {
		st := s.do("GET", "/v1/queues/later/stats", nil, 200)
		return st["scheduled"].(float64), st["pending"].(float64)
	}
	want := func(what string, sch, pend float64) {
		t.Helper()
		if !etcdtest.Eventually(10*time.Second, func() bool { a, b := counts(); return a == sch && b == pend }) {
			a, b := counts()
			t.Fatalf("%s: %v scheduled, %v pending; want %v, %v", what, a, b, sch, pend)
		}
	}

	tb := newTab(t)
	tb.do("open the SCHEDULED tab", chromedp.Navigate(s.base+"/ui/#/queue/later?state=SCHEDULED"))
	tb.waitJS("the SLEEPING tab", `!!document.querySelector('a[data-tab="SLEEPING"]')`)
	tb.waitJS("the WAITING tab", `!!document.querySelector('a[data-tab="WAITING"]')`)
	tb.click(`tr[data-task="r1"] button[data-act="run-now"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	want("after Run now", 3, 1)
	sess := s.session()
	got := s.do("POST", "/v1/queues/later/claim", map[string]any{"session": sess, "max": 5, "wait": "5s"}, 200)["tasks"].([]any)
	if len(got) != 1 || got[0].(map[string]any)["task_id"] != "r1" {
		t.Fatalf("claimed %v, want r1", got)
	}

	tb.waitJS("r1 gone from the list", `!document.querySelector('tr[data-task="r1"]') && !!document.querySelector('tr[data-task="r2"] input[type=checkbox]')`)
	tb.click(`tr[data-task="r2"] input[type=checkbox]`)
	tb.waitJS("one selected", `document.querySelector('button[data-act="run-selected"]').textContent.includes("(1)")`)
	tb.click(`button[data-act="run-selected"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	want("after Run selected now", 2, 1)

	tb.waitJS("r2 gone from the list", `!document.querySelector('tr[data-task="r2"]')`)
	tb.click(`button[data-act="run-all"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	want("after Run all now", 0, 3)
	tb.waitJS("the empty list", `!document.querySelector('tr[data-task]')`)
	tb.noConsoleErrors()
}
