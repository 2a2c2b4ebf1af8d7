package ui_test

import (
	"testing"

	"github.com/chromedp/chromedp"
)

// TestUISchedules: the schedules page lists a schedule, pauses, resumes
// and triggers it, and shows the trigger's fire in its history.
func TestUISchedules(t *testing.T) {
	s := newSite(t)
	s.do("POST", "/v1/schedules", map[string]any{"name": "nightly", "cron": "0 2 * * *", "tz": "Europe/Paris", "queue": "reports", "type": "report"}, 201)
	tb := newTab(t)
	tb.do("open the schedules page", chromedp.Navigate(s.base+"/ui/#/schedules"))
	tb.waitJS("the schedule listed", `!!document.querySelector('#schedules tr[data-schedule="nightly"][data-paused="false"]')`)
	tb.waitJS("its empty history", `!!document.querySelector('#schedule-history')`)
	tb.click(`tr[data-schedule="nightly"] button[data-act="pause"]`)
	tb.waitJS("paused on the page", `!!document.querySelector('tr[data-schedule="nightly"][data-paused="true"]')`)
	if p := s.do("GET", "/v1/schedules/nightly", nil, 200)["paused"]; p != true {
		t.Fatalf("paused %v after the click, want true", p)
	}
	tb.click(`tr[data-schedule="nightly"] button[data-act="trigger"]`)
	tb.waitJS("the trigger's fire in the history", `!!document.querySelector('#schedule-history tr[data-fire^="nightly-manual-"][data-outcome="PENDING"]')`)
	tb.click(`tr[data-schedule="nightly"] button[data-act="resume"]`)
	tb.waitJS("resumed on the page", `!!document.querySelector('tr[data-schedule="nightly"][data-paused="false"]')`)
	tb.noConsoleErrors()
}
