package ui_test

import (
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/httpapi"
)

const agentsToken = "ui-agents-token-0123456789"

// scopedSite is a server with auth whose token "agents" may use two
// namespaces, neither of them the server's own; "ops" may use every one.
// Each of the three namespaces holds a queue named after it.
func scopedSite(t *testing.T) (s *site, teamA, teamB string) {
	t.Helper()
	s = newSite(t, func(c *httpapi.Config) {
		teamA, teamB = c.Namespace+"-team-a", c.Namespace+"-team-b"
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{
			{Name: "agents", Token: agentsToken, Namespaces: []string{teamA, teamB}, Role: "write"},
			{Name: "ops", Token: adminToken, Namespaces: []string{"*"}, Role: "admin"},
		})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	s.token = adminToken
	s.submit("server-queue", "s1")
	s.space = teamA
	s.submit("team-a-queue", "a1")
	s.space = teamB
	s.submit("team-b-queue", "b1")
	s.space = ""
	return s, teamA, teamB
}

// queueShown is a script true once the overview shows queue q's row.
func queueShown(q string) string { return `!!document.querySelector('tr[data-queue="` + q + `"]')` }

// pickNamespace chooses ns in the header's namespace choice.
func (tb *tab) pickNamespace(ns string) {
	tb.t.Helper()
	tb.do("choose namespace "+ns, chromedp.Evaluate[chromedp.Void](`(() => { const s = document.getElementById("ns-pick"); s.value = `+
		strconv.Quote(ns)+`; s.dispatchEvent(new Event("change")); })()`))
}

// TestUIScopedTokenLandsInItsNamespace: a token that may not use the
// server's namespace logs in and lands in the first it may use, sees its
// data, keeps working after a reload, switches among its namespaces only,
// and logs out.
func TestUIScopedTokenLandsInItsNamespace(t *testing.T) {
	s, teamA, teamB := scopedSite(t)
	tb := newTab(t)
	tb.do("open the dashboard", chromedp.Navigate(s.base+"/ui/"))
	tb.waitJS("the login", `!!document.querySelector("form#login input#token")`)
	tb.do("log in", chromedp.SendKeys(chromedp.CSS("#token"), agentsToken), chromedp.Click(chromedp.CSS(`form#login button[type="submit"]`)))
	tb.waitJS("the team's queue", queueShown("team-a-queue"))
	check := func(when, ns, other string) {
		t.Helper()
		text := eval[string](tb, `document.getElementById("main").innerText`)
		if strings.Contains(text, "Not allowed") || strings.Contains(text, other) || strings.Contains(text, "server-queue") {
			t.Fatalf("%s: the page shows another namespace's data or an error:\n%s", when, text)
		}
		if got := eval[string](tb, `sessionStorage.getItem("drover.namespace")`); got != ns {
			t.Errorf("%s: the tab's namespace is %q, want %q", when, got, ns)
		}
		if got := eval[string](tb, `document.getElementById("ns-pick").value`); got != ns {
			t.Errorf("%s: the namespace choice shows %q, want %q", when, got, ns)
		}
		if got := eval[[]string](tb, `[...document.querySelectorAll("#ns-pick option")].map((o) => o.value)`); len(got) != 2 || got[0] != teamA || got[1] != teamB {
			t.Errorf("%s: the namespace choice offers %q, want the token's two", when, got)
		}
		if !eval[bool](tb, `!document.getElementById("session").hidden && !document.getElementById("logout").hidden && !document.getElementById("ns-pick").hidden`) {
			t.Errorf("%s: the header hides the namespace choice or Log out", when)
		}
	}
	check("after the login", teamA, "team-b-queue")

	tb.do("reload", chromedp.Reload())
	tb.waitJS("the team's queue after a reload", queueShown("team-a-queue"))
	check("after a reload", teamA, "team-b-queue")

	tb.pickNamespace(teamB)
	tb.waitJS("the other team's queue", queueShown("team-b-queue")+` && !`+queueShown("team-a-queue"))
	check("after the switch", teamB, "team-a-queue")

	tb.click("#logout")
	tb.waitJS("the login after Log out", `!!document.querySelector("form#login input#token") && document.getElementById("session").hidden`)
	if got := eval[string](tb, `sessionStorage.getItem("drover.token") || ""`); got != "" {
		t.Fatal("the token is still kept after Log out")
	}
	tb.noConsoleErrors()
}

// TestUIForbiddenNamespaceWayOut: a page answered 403 for its namespace
// offers a way back to a namespace the token may use and Log out; a tab's
// namespace that is no name at all is left for an allowed one; when the
// server does not answer at all, the page still offers Log out, which works.
func TestUIForbiddenNamespaceWayOut(t *testing.T) {
	s, teamA, _ := scopedSite(t)
	tb := newTab(t)
	tb.do("open the dashboard", chromedp.Navigate(s.base+"/ui/"))
	tb.waitJS("the login", `!!document.querySelector("form#login input#token")`)
	tb.do("log in", chromedp.SendKeys(chromedp.CSS("#token"), agentsToken), chromedp.Click(chromedp.CSS(`form#login button[type="submit"]`)))
	tb.waitJS("the team's queue", queueShown("team-a-queue"))

	// The tab's namespace turns into one the token may not use (as when the
	// auth file changes under an open tab).
	tb.do("leave the token's namespaces", chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem("drover.namespace", `+strconv.Quote(s.ns)+`); location.hash = "#/locks"`))
	tb.waitJS("the 403", `(document.querySelector("#locks [role=alert]")?.textContent || "").includes("may not use namespace")`)
	if !eval[bool](tb, `!!document.querySelector('#locks button[data-act="logout"]') && !document.getElementById("logout").hidden`) {
		t.Fatal("the 403 offers no Log out")
	}
	tb.click(`#locks button[data-act="allowed-namespace"]`)
	tb.waitJS("the locks of an allowed namespace", `sessionStorage.getItem("drover.namespace") === `+strconv.Quote(teamA)+
		` && !!document.querySelector("#locks .empty") && !document.querySelector("#main [role=alert]")`)

	// A tab's namespace that is no namespace name at all (typed by hand)
	// brings the page back to one the token may use, at a reload too.
	tb.do("name no namespace", chromedp.Evaluate[chromedp.Void](`sessionStorage.setItem("drover.namespace", "not a namespace")`), chromedp.Reload())
	tb.waitJS("back in an allowed namespace", `location.hash === "#/locks" && sessionStorage.getItem("drover.namespace") === `+strconv.Quote(teamA)+
		` && !!document.querySelector("#locks .empty") && !document.querySelector("#main [role=alert]")`)

	s.stop()
	tb.pickNamespace(teamA)
	tb.waitJS("the error without a server", `!!document.querySelector("#start-error [role=alert]")`)
	if !eval[bool](tb, `!!document.querySelector('#start-error button[data-act="logout"]') && !document.getElementById("logout").hidden && !document.getElementById("session").hidden`) {
		t.Fatal("the error page offers no Log out")
	}
	tb.click(`#start-error button[data-act="logout"]`)
	tb.waitJS("the login after Log out", `!!document.querySelector("form#login input#token")`)
	if got := eval[string](tb, `sessionStorage.getItem("drover.token") || ""`); got != "" {
		t.Fatal("the token is still kept after Log out")
	}
	tb.noConsoleErrors()
}

// TestUIRoleForbiddenHasNoNamespaceWayOut: a 403 for the token's role (a
// write token changing a rate limit, an admin's change) offers Log out
// only: another namespace would not help; a 403 for the namespace offers
// both.
func TestUIRoleForbiddenHasNoNamespaceWayOut(t *testing.T) {
	s, teamA, _ := scopedSite(t)
	tb := newTab(t)
	tb.do("open the dashboard", chromedp.Navigate(s.base+"/ui/"))
	tb.waitJS("the login", `!!document.querySelector("form#login input#token")`)
	tb.do("log in", chromedp.SendKeys(chromedp.CSS("#token"), agentsToken), chromedp.Click(chromedp.CSS(`form#login button[type="submit"]`)))
	tb.waitJS("the team's queue", queueShown("team-a-queue"))
	// The box each real 403 gets: the buttons it offers.
	offers := func(what, method, ns string) []string {
		t.Helper()
		body := "undefined"
		if method == "PUT" {
			body = `{rate: "5/s", burst: 5}`
		}
		script := `(async () => {
			const api = await import("./js/api.js"), dom = await import("./js/dom.js");
			sessionStorage.setItem("drover.namespace", ` + strconv.Quote(ns) + `);
			try { await api.api(` + strconv.Quote(method) + `, "/v1/limits/ui-limit", ` + body + `); return ["no error"]; }
			catch (e) { return [String(e.status), ...[...dom.errorBox(e).querySelectorAll("button")].map((b) => b.dataset.act)]; }
		})()`
		got, err := chromedp.Run(tb.ctx, chromedp.Evaluate[[]string](script, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return got
	}
	if got := offers("a change the role may not make", "PUT", teamA); strings.Join(got, " ") != "403 logout" {
		t.Fatalf("a 403 for the role offers %q, want Log out only", got)
	}
	if got := offers("a namespace the token may not use", "GET", s.ns); strings.Join(got, " ") != "403 allowed-namespace logout" {
		t.Fatalf("a 403 for the namespace offers %q, want both ways out", got)
	}
}

// TestUINamespacePlaceholderStaysTheServers: after a switch to another
// namespace, the namespace field's placeholder still names the server's
// (what an empty field goes back to).
func TestUINamespacePlaceholderStaysTheServers(t *testing.T) {
	s := newSite(t)
	other := s.ns + "-other"
	tb := newTab(t)
	tb.do("open the dashboard", chromedp.Navigate(s.base+"/ui/"))
	tb.waitJS("live", `document.getElementById("live").classList.contains("on")`)
	// Only a stream's first event (its snapshot) turns the indicator on:
	// off now, it is on again once the other namespace's has come.
	tb.do("switch namespace", chromedp.SetValue(chromedp.CSS("#ns"), other),
		chromedp.Evaluate[chromedp.Void](`document.getElementById("live").className = "live"; document.getElementById("ns-form").requestSubmit()`))
	tb.waitJS("the other namespace's snapshot", `sessionStorage.getItem("drover.namespace") === `+strconv.Quote(other)+
		` && document.getElementById("live").classList.contains("on")`)
	if got := eval[string](tb, `document.getElementById("ns").placeholder`); got != s.ns {
		t.Fatalf("the field's placeholder is %q after the switch, want the server's %q", got, s.ns)
	}
	tb.noConsoleErrors()
}
