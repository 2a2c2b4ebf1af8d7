package ui_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/queue"
)

// page is one page of the dashboard and what shows it has loaded.
type page struct {
	name, hash, ready string
}

// pages are every page, with data (see fill).
var pages = []page{
	{"overview", "#/", `!!document.querySelector("#queues table") && !!document.querySelector("#workers table") && !!document.querySelector("#locks table") && !!document.querySelector("#chart svg")`},
	{"queue", "#/queue/emails", `!!document.querySelector("#tasks table")`},
	{"dlq", "#/queue/emails?state=DEAD", `!!document.querySelector('#tasks table button[data-act="requeue"]')`},
	{"task", "#/queue/emails/task/e-1", `!!document.querySelector("#task dl.fields") && !!document.querySelector("#task table")`},
	{"locks", "#/locks", `!!document.querySelector('#locks tr[data-lock="nightly-report"]') && !!document.querySelector("#lines table")`},
	{"workers", "#/workers", `!!document.querySelector("#workers table") && !!document.querySelector("#registry table")`},
	{"flow", "#/flow", `!!document.querySelector("#limits table") && !!document.querySelector("#quotas table") && !!document.querySelector("#breakers table")`},
	{"paxos", "#/paxos", `!!document.querySelector("#paxos-none")`},
	{"budgets", "#/budgets", `!!document.querySelector('[data-budget="openai/gpt-4.1/key-prod"] [data-tenant="globex"]')`},
}

// fill gives every page something to show: queues with tasks in several
// states (one with step checkpoints), a worker, a held lock with a waiter,
// a registered component, a rate limit, a quota, breakers and LLM budgets. It returns a
// function that ends the lock's wait.
func fill(t *testing.T, s *site) (stop func()) {
	t.Helper()
	ids := make([]string, 12)
	for i := range ids {
		ids[i] = "e-" + strconv.Itoa(i+1)
	}
	s.submit("emails", ids...)
	s.submit("reports", "r-1", "r-2", "r-3")
	qc, err := queue.NewClient(s.cli, s.ns)
	if err != nil {
		t.Fatal(err)
	}
	if err := qc.SetConfig(context.Background(), "emails", queue.Config{MaxDepth: 10000}); err != nil {
		t.Fatal(err)
	}
	sess := s.session()
	s.kill("emails", sess, 2)
	s.do("POST", "/v1/queues/emails/claim", map[string]any{"session": sess, "max": 3}, 200)
	// e-1 is pending: give it step checkpoints as an agent task would.
	c := s.do("POST", "/v1/agent-tasks/e-1/claim", map[string]any{"session": sess, "steps": 3}, 200)
	s.do("PUT", "/v1/agent-tasks/e-1/steps/1", map[string]any{"session": sess, "token": c["token"], "name": "fetch", "state": "eyJyb3dzIjo0Mn0="}, 200)
	s.do("DELETE", "/v1/agent-tasks/e-1/claim?session="+sess+"&token="+strconv.FormatInt(int64(c["token"].(float64)), 10), nil, 204)

	s.do("PUT", "/v1/registry/worker/mail-worker-1", map[string]any{"session": sess, "address": "10.0.0.7",
		"data": map[string]any{"queue": "emails", "concurrency": 8, "prefetch": 8, "in_flight": 3, "claimed": 120, "succeeded": 112,
			"failed": 5, "pid": 4242, "host": "mail-1", "started_at": time.Now().Add(-time.Hour).UTC()}}, 201)
	s.do("PUT", "/v1/registry/llm-gateway/gw-1", map[string]any{"session": sess, "address": "10.0.0.9:9000", "data": map[string]any{"load": 0.42, "models": []string{"small", "large"}}}, 201)

	s.do("PUT", "/v1/limits/openai-tokens", map[string]any{"rate": "90000/m", "burst": 20000}, 200)
	s.do("POST", "/v1/limits/openai-tokens/take", map[string]any{"n": 4500}, 200)
	s.do("PUT", "/v1/quotas/tenant", map[string]any{"limit": 4}, 200)
	s.do("POST", "/v1/quotas/tenant/acquire", map[string]any{"session": sess, "subject": "acme"}, 200)
	s.do("PUT", "/v1/breakers/search-api", map[string]any{"failures": 3, "cooldown": "30s"}, 200)
	s.do("PUT", "/v1/breakers/llm", map[string]any{"failures": 1, "cooldown": "5m"}, 200)
	call := s.do("POST", "/v1/breakers/llm/allow", map[string]any{}, 200)["call"]
	s.do("POST", "/v1/breakers/llm/outcome", map[string]any{"ok": false, "call": call}, 200)

	fillBudgets(s)

	lock := s.do("POST", "/v1/locks/nightly-report", map[string]any{"session": sess}, 200)
	waiter := s.session()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // waits in line until stop releases the lock (or 50 s pass)
		defer wg.Done()
		r, err := s.hc.Post(s.base+"/v1/locks/nightly-report?wait=50s", "application/json", strings.NewReader(`{"session":"`+waiter+`"}`))
		if err == nil {
			r.Body.Close()
		}
	}()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			req, _ := http.NewRequest("DELETE", s.base+"/v1/locks/nightly-report?token="+strconv.FormatInt(int64(lock["token"].(float64)), 10)+
				"&contender="+lock["contender"].(string)+"&session="+sess, nil)
			if r, err := s.hc.Do(req); err == nil {
				r.Body.Close()
			}
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// TestUIPagesNoConsoleErrors: every page loads its data, shows no error,
// and logs no console error or exception, in one tab that follows the
// live stream throughout.
func TestUIPagesNoConsoleErrors(t *testing.T) {
	s := newSite(t)
	fill(t, s)
	tb := newTab(t)
	tb.do("open the dashboard", chromedp.Navigate(s.base+"/ui/"))
	for _, p := range pages {
		tb.do("open "+p.name, chromedp.Navigate(s.base+"/ui/"+p.hash))
		tb.waitJS(p.name+" loaded", p.ready)
		if errs := eval[[]string](tb, `[...document.querySelectorAll("#main [role=alert]")].map((e) => e.textContent)`); len(errs) > 0 {
			t.Errorf("%s shows errors: %q", p.name, errs)
		}
	}
	tb.waitJS("the live stream", `document.getElementById("live").classList.contains("on")`)
	tb.do("let live updates come", chromedp.Sleep(1200*time.Millisecond))
	tb.noConsoleErrors()
}
