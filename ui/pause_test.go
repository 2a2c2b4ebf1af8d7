package ui_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestUIPauseResume: the queue page's Pause button (after its
// confirmation) pauses the queue for the API as for the page, which shows
// a paused badge, as the overview does; Resume resumes it. With
// DROVER_UI_SCREENSHOTS set it writes the paused queue page there
// (queue-paused.png).
func TestUIPauseResume(t *testing.T) {
	s := newSite(t)
	s.submit("mail", "m1", "m2", "m3")
	paused := func() bool { return s.do("GET", "/v1/queues/mail/stats", nil, 200)["paused"] == true }

	tb := newTab(t)
	tb.do("open the queue", chromedp.Navigate(s.base+"/ui/#/queue/mail"))
	tb.click(`#pause button[data-act="pause"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	if !etcdtest.Eventually(10*time.Second, paused) {
		t.Fatal("the queue is not paused after the click")
	}
	tb.waitJS("the paused badge and the resume button", `!!document.querySelector('#pause .badge') && !!document.querySelector('#pause button[data-act="resume"]')`)
	if dir := os.Getenv("DROVER_UI_SCREENSHOTS"); dir != "" {
		tb.do("size", chromedp.EmulateViewport(1280, 900))
		tb.waitJS("the tasks", `!!document.querySelector('tr[data-task="m1"]')`)
		png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "queue-paused.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tb.do("open the overview", chromedp.Navigate(s.base+"/ui/#/"))
	tb.waitJS("the overview's paused badge", `!!document.querySelector('tr[data-queue="mail"] .badge')`)
	tb.do("back to the queue", chromedp.Navigate(s.base+"/ui/#/queue/mail"))
	tb.click(`#pause button[data-act="resume"]`)
	if !etcdtest.Eventually(10*time.Second, func() bool { return !paused() }) {
		t.Fatal("the queue is still paused after the resume")
	}
	tb.waitJS("the pause button back", `!document.querySelector('#pause .badge') && !!document.querySelector('#pause button[data-act="pause"]')`)
	tb.noConsoleErrors()
}
