package ui_test

import (
	"testing"

	"github.com/chromedp/chromedp"
)

// TestUIPauseResumedElsewhere: after a click on Pause, the queue page
// shows what the next summary says, whoever changed the queue since: a
// resume from elsewhere (the CLI, another page) right after the click
// brings the Pause button back, instead of the page keeping the state
// its click set until the summaries agree with it (the dashboard's
// summaries come when a queue's counts or state change).
func TestUIPauseResumedElsewhere(t *testing.T) {
	s := newSite(t)
	s.submit("news", "n1")
	tb := newTab(t)
	tb.do("open the queue", chromedp.Navigate(s.base+"/ui/#/queue/news"))
	tb.click(`#pause button[data-act="pause"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	tb.waitJS("the resume button the click set", `!!document.querySelector('#pause button[data-act="resume"]')`)
	s.do("POST", "/v1/queues/news/resume", nil, 200)
	// The summaries come when the queue's counts change: one more task.
	s.submit("news", "n2")
	tb.waitJS("the new count", `document.querySelector('a[data-tab="PENDING"] .count').textContent === "2"`)
	tb.waitJS("the pause button back", `!document.querySelector('#pause .badge') && !!document.querySelector('#pause button[data-act="pause"]')`)
	tb.noConsoleErrors()
}
