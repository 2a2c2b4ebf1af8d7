package ui_test

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/httpapi"
)

// TestUIScreenshots writes a PNG of every page to the folder named by
// DROVER_UI_SCREENSHOTS (docs/ui, from the repository's root: run
// DROVER_UI_SCREENSHOTS=$PWD/docs/ui go test ./ui -run TestUIScreenshots):
// each page at desktop width (the Paxos page with a group of fake nodes,
// and without a group), the overview and the flow page at phone width, the
// overview and the dead-letter queue in dark mode, and the login of a
// server with auth. It
// first runs a minute of work through the queue so that the chart has a
// history to draw. Without the variable it is skipped.
func TestUIScreenshots(t *testing.T) {
	dir := os.Getenv("DROVER_UI_SCREENSHOTS")
	if dir == "" {
		t.Skip("set DROVER_UI_SCREENSHOTS to a folder (docs/ui) to write the dashboard's screenshots")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s := newSite(t, func(c *httpapi.Config) { c.StatsInterval = 2 * time.Second }, withPaxosGroup(t))
	bare := newSite(t) // knows no Paxos group
	authed := newSite(t, func(c *httpapi.Config) {
		auth, err := httpapi.NewAuth([]httpapi.AuthEntry{{Name: "ops", Token: adminToken, Namespaces: []string{"*"}, Role: "admin"}})
		if err != nil {
			t.Fatal(err)
		}
		c.Auth = auth
	})
	work(t, s, 50*time.Second)
	fill(t, s)

	tb := newTab(t)
	shoot := func(name, base, hash, ready string, width int64, scale float64, dark bool) {
		t.Helper()
		scheme := "light"
		if dark {
			scheme = "dark"
		}
		if _, err := chromedp.Call(tb.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
			Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}}); err != nil {
			t.Fatal(err)
		}
		tb.do("size "+name, chromedp.EmulateViewport(width, 900, chromedp.EmulateScale(scale)))
		tb.do("open "+name, chromedp.Navigate(base+"/ui/"+hash))
		tb.waitJS(name+" loaded", ready)
		tb.do("let it draw", chromedp.Sleep(700*time.Millisecond))
		png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range pages {
		if p.name == "paxos" {
			shoot("paxos", s.base, p.hash, `!!document.querySelector("#paxos table")`, 1280, 1, false)
			shoot("paxos-none", bare.base, p.hash, p.ready, 1280, 1, false)
			continue
		}
		shoot(p.name, s.base, p.hash, p.ready, 1280, 1, false)
	}
	shoot("login", authed.base, "#/", `!!document.querySelector("#login")`, 1280, 1, false)
	shoot("overview-phone", s.base, "#/", pages[0].ready, 390, 2, false)
	shoot("flow-phone", s.base, "#/flow", pages[6].ready, 390, 2, false)
	shoot("overview-dark", s.base, "#/", pages[0].ready, 1280, 1, true)
	shoot("queue-dark", s.base, "#/queue/emails?state=DEAD", pages[2].ready, 1280, 1, true)
	tb.noConsoleErrors()
}

// work runs tasks through queue "summaries" for d, in the way an HTTP worker
// would, at a rate that changes over time, with a failure now and then.
func work(t *testing.T, s *site, d time.Duration) {
	t.Helper()
	sess := s.session()
	start := time.Now()
	n := 0
	for time.Since(start) < d {
		phase := int(time.Since(start) / (5 * time.Second))
		batch := 3 + (phase*7)%11
		ids := make([]string, batch)
		for i := range ids {
			n++
			ids[i] = "w-" + strconv.Itoa(n)
		}
		s.submit("summaries", ids...)
		r := s.do("POST", "/v1/queues/summaries/claim", map[string]any{"session": sess, "max": batch}, 200)
		for i, x := range r["tasks"].([]any) {
			task := x.(map[string]any)
			path := "/v1/queues/summaries/tasks/" + task["task_id"].(string)
			if (n+i)%17 == 0 {
				s.do("POST", path+"/fail", map[string]any{"session": sess, "token": task["token"], "error": "smtp: 421 try again later", "permanent": true}, 200)
				continue
			}
			s.do("POST", path+"/ack", map[string]any{"session": sess, "token": task["token"], "result": map[string]any{"sent": true}}, 200)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
