package ui_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// TestUISearchBox: the queue page's search box finds tasks by id prefix,
// by type and parameter from the page's address, pages on with Next, and
// shows the problem of a time range that ends before it starts. With
// DROVER_UI_SCREENSHOTS set it writes queue-search.png there.
func TestUISearchBox(t *testing.T) {
	s := newSite(t)
	fill(t, s)
	var tasks []map[string]any
	for i := range 70 {
		tasks = append(tasks, map[string]any{"task_id": fmt.Sprintf("rep-%02d", i), "task_type": "render",
			"parameters": map[string]any{"n": i, "format": map[bool]string{true: "pdf", false: "html"}[i%3 == 0],
				"title": map[bool]string{true: "weekly report", false: "daily report"}[i%5 == 0]}})
	}
	s.do("POST", "/v1/queues/emails/tasks", tasks, 200)
	tb := newTab(t)
	found := func(what string, n int) {
		t.Helper()
		tb.waitJS(what, fmt.Sprintf(`document.querySelectorAll("#search-results tr[data-found]").length === %d && !document.querySelector("#search-note").textContent.startsWith("Searching")`, n))
	}

	tb.do("open the queue", chromedp.Navigate(s.base+"/ui/#/queue/emails"))
	tb.waitJS("the search box", `!!document.querySelector("#search-form") && !!document.querySelector("#tasks table")`)
	tb.do("type an id prefix", chromedp.SetValue(chromedp.CSS(`#search-form input[name="id_prefix"]`), "e-1"))
	tb.click(`#search-form button[data-act="search"]`)
	found("e-1, e-10, e-11, e-12", 4)
	if h := eval[string](tb, `location.hash`); h != "#/queue/emails?f_id=e-1" {
		t.Fatalf("the address keeps %q", h)
	}

	tb.do("open a search by address", chromedp.Navigate(s.base+"/ui/#/queue/emails?f_type=render&f_param=format%3Dpdf"))
	found("pdf renders", 24)
	// One key=value a line: a value may hold spaces (i%15 == 0: 0, 15, 30, 45, 60).
	tb.do("open a search with a value with a space", chromedp.Navigate(s.base+"/ui/#/queue/emails?f_type=render&f_param=title%3Dweekly%20report%0Aformat%3Dpdf"))
	found("weekly pdf renders", 5)
	tb.do("type two lines of parameters", chromedp.SetValue(chromedp.CSS(`#search-form textarea[name="param"]`), "title=daily report\nformat=pdf"))
	tb.click(`#search-form button[data-act="search"]`)
	found("daily pdf renders", 19)
	if h := eval[string](tb, `location.hash`); h != "#/queue/emails?f_type=render&f_param=title%3Ddaily+report%0Aformat%3Dpdf" {
		t.Fatalf("the address keeps %q", h)
	}
	tb.do("open a long search", chromedp.Navigate(s.base+"/ui/#/queue/emails?f_type=render"))
	found("the first page", 50)
	tb.click(`#search .pager button[data-act="search-next"]`)
	found("the second page", 20)
	if next := eval[bool](tb, `document.querySelector('#search .pager button[data-act="search-next"]').disabled`); !next {
		t.Fatal("Next is enabled on the last page")
	}

	tb.do("a range that ends before it starts", chromedp.Navigate(s.base+"/ui/#/queue/emails?f_since=2026-11-28T10:00:00Z&f_until=2026-11-28T09:00:00Z"))
	tb.waitJS("the problem", `(document.querySelector("#search-results [role=alert]") || {}).textContent?.includes("until")`)

	if dir := os.Getenv("DROVER_UI_SCREENSHOTS"); dir != "" {
		tb.do("size", chromedp.EmulateViewport(1280, 900))
		tb.do("open a search to show", chromedp.Navigate(s.base+"/ui/#/queue/emails?f_type=render&f_param=format%3Dpdf&f_since=1h"))
		found("pdf renders", 24)
		tb.do("let it draw", chromedp.Sleep(300*time.Millisecond))
		png, err := chromedp.Run(tb.ctx, chromedp.CaptureScreenshot()) // the viewport: the search, and the listing below it
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "queue-search.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tb.noConsoleErrors()
}
