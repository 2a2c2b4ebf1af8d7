package ui_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// chromium is Debian's Chromium, which the browser tests drive.
const chromium = "/usr/bin/chromium"

// site is a real drover HTTP server, dashboard included, on a loopback
// port, serving the test's own namespace.
type site struct {
	t     *testing.T
	base  string // http://127.0.0.1:port
	ns    string
	token string // sent as a bearer token when set
	space string // sent as Drover-Namespace when set
	hc    *http.Client
	cli   *clientv3.Client
	stop  func() // stops the server (again at the test's end: once)
}

// newSite starts a server on the shared etcd; edit changes its config.
func newSite(t *testing.T, edit ...func(*httpapi.Config)) *site {
	t.Helper()
	cfg := httpapi.Config{Etcd: etcd.Client(t), Namespace: etcdtest.Namespace(t), Logger: slog.New(slog.DiscardHandler),
		Registerer: prometheus.NewRegistry(), MaxWait: time.Minute}
	for _, e := range edit {
		e(&cfg)
	}
	s, err := httpapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l, "", "") }()
	hc := &http.Client{Timeout: 30 * time.Second}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a bound, not a measure: a loaded machine drains slowly
			defer cancel()
			if err := s.Close(ctx); err != nil {
				// Which handler did not return: the stacks of every
				// goroutine, for the next look.
				var b strings.Builder
				_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
				t.Errorf("%v; goroutines:\n%s", err, b.String())
			}
			if err := <-done; err != nil {
				t.Error(err)
			}
			hc.CloseIdleConnections()
		})
	}
	t.Cleanup(stop)
	return &site{t: t, base: "http://" + l.Addr().String(), ns: cfg.Namespace, hc: hc, cli: cfg.Etcd, stop: stop}
}

// do sends method path with body as JSON and decodes the answer into a
// map, failing the test unless its status is want.
func (s *site) do(method, path string, body any, want int) map[string]any {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			s.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequest(method, s.base+path, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if s.token != "" {
		req.Header.Set("Authorization", "Bearer "+s.token)
	}
	if s.space != "" {
		req.Header.Set(httpapi.NamespaceHeader, s.space)
	}
	r, err := s.hc.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	if r.StatusCode != want {
		s.t.Fatalf("%s %s: status %d, want %d: %s", method, path, r.StatusCode, want, raw)
	}
	out := map[string]any{}
	_ = json.Unmarshal(raw, &out)
	return out
}

// submit submits tasks with the given ids to queue q.
func (s *site) submit(q string, ids ...string) {
	s.t.Helper()
	tasks := make([]map[string]any, len(ids))
	for i, id := range ids {
		tasks[i] = map[string]any{"task_id": id, "task_type": "email", "parameters": map[string]any{"to": id + "@example.com", "template": "welcome"}}
	}
	s.do("POST", "/v1/queues/"+q+"/tasks", tasks, 200)
}

// session creates a session that lasts the test.
func (s *site) session() string {
	s.t.Helper()
	return s.do("POST", "/v1/sessions", map[string]any{"ttl": 60, "name": "ui-test"}, 201)["id"].(string)
}

// kill claims n tasks of q under sess and fails them for good: they go to
// the dead-letter queue. It returns their ids.
func (s *site) kill(q, sess string, n int) []string {
	s.t.Helper()
	r := s.do("POST", "/v1/queues/"+q+"/claim", map[string]any{"session": sess, "max": n}, 200)
	var ids []string
	for _, x := range r["tasks"].([]any) {
		task := x.(map[string]any)
		id := task["task_id"].(string)
		s.do("POST", "/v1/queues/"+q+"/tasks/"+id+"/fail", map[string]any{"session": sess, "token": task["token"], "error": "smtp: 550 mailbox unavailable", "permanent": true}, 200)
		ids = append(ids, id)
	}
	return ids
}

// sleep claims one task of q under sess and reports it asleep for d
// (a duration such as 1h): it goes SLEEPING. It returns its id.
func (s *site) sleep(q, sess, d string) string {
	s.t.Helper()
	r := s.do("POST", "/v1/queues/"+q+"/claim", map[string]any{"session": sess, "max": 1}, 200)
	tasks := r["tasks"].([]any)
	if len(tasks) != 1 {
		s.t.Fatalf("claim of %s: %d tasks, want 1", q, len(tasks))
	}
	task := tasks[0].(map[string]any)
	id := task["task_id"].(string)
	s.do("POST", "/v1/queues/"+q+"/outcomes", map[string]any{"session": sess,
		"outcomes": []map[string]any{{"task_id": id, "token": task["token"], "sleep_for": d}}}, 200)
	return id
}

// browser is one Chromium for the package's tests, started by the first
// test that needs it; each test opens tabs of its own.
var browser struct {
	once   sync.Once
	ctx    context.Context
	cancel func()
	err    error
}

// browserContext returns the shared browser, started now if need be; the
// test is skipped when Chromium is missing, unless
// DROVER_REQUIRE_SERVICES=1 (then it fails).
func browserContext(t *testing.T) context.Context {
	t.Helper()
	if _, err := os.Stat(chromium); err != nil {
		msg := fmt.Sprintf("the dashboard's browser tests need Chromium at %s (apt-get install chromium): %v", chromium, err)
		if os.Getenv("DROVER_REQUIRE_SERVICES") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	browser.once.Do(startBrowser)
	if browser.err != nil {
		t.Fatalf("start Chromium: %v", browser.err)
	}
	return browser.ctx
}

// startBrowser starts the shared browser; TestMain calls it early, in the
// background, so that Chromium starts while etcd does.
func startBrowser() {
	dir, err := os.MkdirTemp("", "drover-ui-chromium-")
	if err != nil {
		browser.err = err
		return
	}
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(),
		chromedp.ExecPath(chromium), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck, chromedp.UserDataDir(dir), chromedp.WindowSize(1280, 900),
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.Flag("disable-extensions", true))
	ctx, cancelCtx := chromedp.NewContext(alloc)
	browser.ctx = ctx
	browser.cancel = func() {
		cancelCtx()
		cancelAlloc()
		_ = os.RemoveAll(dir)
	}
	browser.err = chromedp.Do(ctx) // starts the browser
}

// closeBrowser stops the shared browser, once it is started (it waits
// for a start under way).
func closeBrowser() {
	browser.once.Do(func() {})
	if browser.cancel != nil {
		browser.cancel()
	}
}

// tab is a browser tab that records every console error and uncaught
// exception of its pages.
type tab struct {
	t    *testing.T
	ctx  context.Context
	mu   sync.Mutex
	errs []string
}

// newTab opens a tab that closes when the test ends; its steps together
// are bounded by a minute.
func newTab(t *testing.T) *tab {
	t.Helper()
	tb := &tab{t: t}
	ctx, cancel := chromedp.NewContext(browserContext(t), chromedp.WithListener(tb.listen))
	ctx, cancelTimeout := context.WithTimeout(ctx, time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancel()
	})
	tb.ctx = ctx
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("open a tab: %v", err)
	}
	return tb
}

// listen records console.error and console.assert calls, uncaught
// exceptions, and the browser's own error entries (a script the content
// security policy refused, a file of the dashboard that did not load); the
// API's answers are judged by the tests.
func (tb *tab) listen(ev any) {
	var msg string
	switch ev := ev.(type) {
	case *runtime.EventConsoleAPICalled:
		if ev.Type == runtime.ConsoleAPICalledTypeError || ev.Type == runtime.ConsoleAPICalledTypeAssert {
			var parts []string
			for _, a := range ev.Args {
				parts = append(parts, string(a.Value)+a.Description)
			}
			msg = "console." + string(ev.Type) + ": " + strings.Join(parts, " ")
		}
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg = "exception: " + d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
	case *log.EventEntryAdded:
		e := ev.Entry
		if e.Level == log.EntryLevelError && !(e.Source == log.EntrySourceNetwork && strings.Contains(e.URL, "/v1/")) {
			msg = "log " + string(e.Source) + ": " + e.Text + " " + e.URL
		}
	}
	if msg != "" {
		tb.mu.Lock()
		tb.errs = append(tb.errs, msg)
		tb.mu.Unlock()
	}
}

// noConsoleErrors fails the test if a page of the tab logged an error.
func (tb *tab) noConsoleErrors() {
	tb.t.Helper()
	tb.mu.Lock()
	defer tb.mu.Unlock()
	if len(tb.errs) > 0 {
		tb.t.Fatalf("console errors:\n%s", strings.Join(tb.errs, "\n"))
	}
}

// do runs actions in the tab, failing the test on an error.
func (tb *tab) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	tb.t.Helper()
	if err := chromedp.Do(tb.ctx, actions...); err != nil {
		tb.t.Fatalf("%s: %v", what, err)
	}
}

// waitJS waits until the JavaScript expression is true, for up to 15 s.
func (tb *tab) waitJS(what, expr string) {
	tb.t.Helper()
	if _, err := chromedp.Run(tb.ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond),
		chromedp.WithPollingTimeout(15*time.Second))); err != nil {
		text, _ := chromedp.Run(tb.ctx, chromedp.Evaluate[string](`document.getElementById("main").innerText`))
		tb.t.Fatalf("%s (waited for %s): %v; the page shows:\n%s", what, expr, err, text)
	}
}

// eval returns the value of a JavaScript expression.
func eval[T any](tb *tab, expr string) T {
	tb.t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		tb.t.Fatalf("evaluate %s: %v", expr, err)
	}
	return v
}

// click clicks the element of a CSS selector once it is visible. A page
// that re-renders between the query and the click (the data it shows
// arrived) leaves the queried node stale: that attempt fails before any
// mouse event is sent, so click queries again, a bounded number of times.
func (tb *tab) click(sel string) {
	tb.t.Helper()
	const attempts = 5
	var err error
	for range attempts {
		err = chromedp.Do(tb.ctx, chromedp.WaitVisible(chromedp.CSS(sel)), chromedp.Click(chromedp.CSS(sel)))
		if !staleNode(err) {
			break
		}
	}
	if err != nil {
		tb.t.Fatalf("click %s: %v", sel, err)
	}
}

// clickUntil clicks sel until expr holds, waiting up to 5 s after each
// click, three clicks at most, then waits for expr as waitJS does. A click
// the page lost (its control moved as the page re-rendered under it, a
// reload of a busy page) is made again: for controls whose second click
// is harmless, with an expr that is false until the first one's effect.
// A click after the first is the page's own (element.click()), so that a
// control gone with the effect is no wait.
func (tb *tab) clickUntil(sel, what, expr string) {
	tb.t.Helper()
	tb.click(sel)
	for range 3 {
		if _, err := chromedp.Run(tb.ctx, chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingInterval(50*time.Millisecond),
			chromedp.WithPollingTimeout(5*time.Second))); err == nil {
			return
		}
		eval[bool](tb, `(() => { const b = document.querySelector(`+strconv.Quote(sel)+`); if (b) b.click(); return true; })()`)
	}
	tb.waitJS(what, expr)
}

// staleNode says whether err is the browser's answer about a node the page
// has since removed: no node with that id, or no box for it.
func staleNode(err error) bool {
	var cdpErr *cdproto.Error
	if errors.As(err, &cdpErr) {
		return cdpErr.Code == -32000 && strings.Contains(strings.ToLower(cdpErr.Message), "node")
	}
	return errors.Is(err, chromedp.ErrInvalidDimensions)
}
