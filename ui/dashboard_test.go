package ui_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestUIOverviewCounts: the overview shows the counts by state of a queue
// the test filled (scheduled, pending, running, sleeping, dead), and a
// waiting count (none here) beside the others, in its row and its card;
// the queue's page shows the same counts on its tabs.
func TestUIOverviewCounts(t *testing.T) {
	s := newSite(t)
	s.submit("emails", "e1", "e2", "e3", "e4", "e5", "e6")
	s.do("POST", "/v1/queues/emails/tasks", []map[string]any{{"task_id": "later", "task_type": "x", "delay": "1h"}}, 200)
	sess := s.session()
	s.kill("emails", sess, 1)
	s.do("POST", "/v1/queues/emails/claim", map[string]any{"session": sess, "max": 1}, 200)
	s.sleep("emails", sess, "1h")

	want := map[string]string{"scheduled": "1", "pending": "3", "running": "1", "retrying": "0", "sleeping": "1", "waiting": "0", "succeeded": "0", "dead": "1", "cancelled": "0"}
	tb := newTab(t)
	tb.do("open the overview", chromedp.Navigate(s.base+"/ui/"))
	count := func(state string) string {
		return fmt.Sprintf(`document.querySelector('tr[data-queue="emails"] [data-state="%s"]')?.textContent`, state)
	}
	tb.waitJS("the queue's row", count("pending")+` === "3"`)
	for state, n := range want {
		if got := eval[string](tb, count(state)); got != n {
			t.Errorf("overview, %s: the page shows %q, want %q", state, got, n)
		}
	}
	if got := eval[string](tb, `[...document.querySelectorAll(".card")].find((c) => c.querySelector(".label").textContent === "Waiting")?.querySelector(".value").textContent`); got != "0" {
		t.Errorf("the Waiting card shows %q, want 0", got)
	}

	tb.do("open the queue", chromedp.Navigate(s.base+"/ui/#/queue/emails"))
	tab := func(state string) string {
		return fmt.Sprintf(`document.querySelector('a[data-tab="%s"] .count')?.textContent`, strings.ToUpper(state))
	}
	tb.waitJS("the queue's tabs", tab("pending")+` === "3"`)
	for state, n := range want {
		if got := eval[string](tb, tab(state)); got != n {
			t.Errorf("queue page, %s: the tab shows %q, want %q", state, got, n)
		}
	}
	tb.noConsoleErrors()
}

// TestUIRequeueDeadTask: requeueing a dead task from the queue's DLQ page,
// after the confirmation, moves it back to PENDING (read from the API).
func TestUIRequeueDeadTask(t *testing.T) {
	s := newSite(t)
	s.submit("jobs", "j1", "j2")
	dead := s.kill("jobs", s.session(), 1)[0]

	tb := newTab(t)
	tb.do("open the DLQ", chromedp.Navigate(s.base+"/ui/#/queue/jobs?state=DEAD"))
	tb.click(`tr[data-task="` + dead + `"] button[data-act="requeue"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	ok := etcdtest.Eventually(10*time.Second, func() bool {
		return s.do("GET", "/v1/queues/jobs/tasks/"+dead, nil, 200)["current_status"] == "PENDING"
	})
	if !ok {
		t.Fatalf("task %s is %v after the requeue, want PENDING", dead, s.do("GET", "/v1/queues/jobs/tasks/"+dead, nil, 200)["current_status"])
	}
	tb.waitJS("the DLQ without the task", `document.querySelector('#tasks') && !document.querySelector('tr[data-task="`+dead+`"]')`)
	tb.noConsoleErrors()
}

// TestUIBreakerReset: resetting an open breaker from the flow page closes
// it, for the API as for the page.
func TestUIBreakerReset(t *testing.T) {
	s := newSite(t)
	s.do("PUT", "/v1/breakers/llm", map[string]any{"failures": 1, "cooldown": "5m"}, 200)
	call := s.do("POST", "/v1/breakers/llm/allow", map[string]any{}, 200)["call"]
	s.do("POST", "/v1/breakers/llm/outcome", map[string]any{"ok": false, "call": call}, 200)
	if st := s.do("GET", "/v1/breakers/llm", nil, 200)["state"]; st != "open" {
		t.Fatalf("the breaker is %v, want open", st)
	}

	tb := newTab(t)
	tb.do("open the flow page", chromedp.Navigate(s.base+"/ui/#/flow"))
	tb.click(`tr[data-breaker="llm"][data-state="open"] button[data-act="reset"]`)
	tb.waitJS("the breaker closed on the page", `!!document.querySelector('tr[data-breaker="llm"][data-state="closed"]')`)
	if st := s.do("GET", "/v1/breakers/llm", nil, 200)["state"]; st != "closed" {
		t.Fatalf("the breaker is %v after the reset, want closed", st)
	}
	tb.noConsoleErrors()
}

// TestUILiveTask: a task submitted while the queue's page is open appears
// on it without a reload.
func TestUILiveTask(t *testing.T) {
	s := newSite(t)
	s.submit("live", "first")
	tb := newTab(t)
	tb.do("open the queue", chromedp.Navigate(s.base+"/ui/#/queue/live"))
	tb.waitJS("the first task", `!!document.querySelector('tr[data-task="first"]')`)
	tb.waitJS("the live stream", `document.getElementById("live").classList.contains("on")`)
	tb.do("mark the page", chromedp.Evaluate[chromedp.Void](`window.notReloaded = true`))
	s.submit("live", "second")
	tb.waitJS("the second task", `!!document.querySelector('tr[data-task="second"]')`)
	if !eval[bool](tb, `window.notReloaded === true`) {
		t.Fatal("the page was reloaded")
	}
	tb.noConsoleErrors()
}

const adminToken = "ui-admin-token-0123456789"

// TestUILogin: with auth on, a page opened without a token shows the login
// and no data (it asks the API nothing but who the token is); with the
// token it shows the queues.
func TestUILogin(t *testing.T) {
	s := newSite(t, func(c *httpapi.Config) {
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{{Name: "ops", Token: adminToken, Namespaces: []string{"*"}, Role: "admin"}})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	s.token = adminToken
	s.submit("secret-queue", "s1")

	tb := newTab(t)
	tb.do("open the dashboard", chromedp.Navigate(s.base+"/ui/"))
	tb.waitJS("the login", `!!document.querySelector("form#login input#token")`)
	tb.do("let it settle", chromedp.Sleep(300*time.Millisecond))
	if text := eval[string](tb, `document.body.innerText`); strings.Contains(text, "secret-queue") {
		t.Fatalf("the login page shows data:\n%s", text)
	}
	asked := eval[[]string](tb, `performance.getEntriesByType("resource").map((e) => new URL(e.name).pathname).filter((p) => p.startsWith("/v1/"))`)
	if len(asked) != 1 || asked[0] != "/v1/whoami" {
		t.Fatalf("without a token the page asked the API %v, want only /v1/whoami", asked)
	}
	if eval[bool](tb, `!!document.querySelector("#queues") || !document.getElementById("session").hidden`) {
		t.Fatal("the login page shows the overview or the session bar")
	}

	tb.do("log in", chromedp.SendKeys(chromedp.CSS("#token"), adminToken), chromedp.Click(chromedp.CSS(`form#login button[type="submit"]`)))
	tb.waitJS("the queue after the login", `!!document.querySelector('tr[data-queue="secret-queue"]')`)
	if got := eval[string](tb, `sessionStorage.getItem("drover.token")`); got != adminToken {
		t.Fatalf("sessionStorage holds %q, want the token", got)
	}
	tb.noConsoleErrors()
}
