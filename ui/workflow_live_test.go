package ui_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/internal/childview/childviewtest"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
)

// openWith opens the dashboard, runs script in the page (to wrap fetch
// before the task page reads anything), then goes to the page of hash.
func (tb *tab) openWith(base, script, hash string) {
	tb.t.Helper()
	tb.do("open the dashboard", chromedp.Navigate(base+"/ui/#/"))
	tb.waitJS("the dashboard", `!!document.getElementById("main")`)
	eval[bool](tb, "(() => {"+script+"; return true; })()")
	eval[bool](tb, `(() => { location.hash = `+strconv.Quote(hash)+`; return true; })()`)
}

// TestUILiveReconnectsAfterClosing: an end of reason closing (a server
// shutting down) is not the stream's end: the page says it reconnects,
// reconnects from the next event, and shows the events that follow until
// the final end (done). The first stream request answers a made-up
// closing end.
func TestUILiveReconnectsAfterClosing(t *testing.T) {
	s := newSite(t)
	start := make(chan struct{})
	s.runWorker("chat", func(w *queue.Worker, _ *task.Store) {
		w.Handle("answer", func(ctx context.Context, tk *queue.Task) ([]byte, error) {
			select {
			case <-start:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if err := stream.Token(ctx, "after the break"); err != nil {
				return nil, err
			}
			return []byte(`"ok"`), nil
		})
	})
	c := s.queueClient()
	if _, err := c.Submit(context.Background(), "chat", []queue.Task{{ID: "chat-2", Type: "answer"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(20*time.Second, func() bool {
		return s.do("GET", "/v1/queues/chat/tasks/chat-2", nil, 200)["current_status"] == "RUNNING"
	}) {
		t.Fatal("the task does not run")
	}
	tb := newTab(t)
	tb.openWith(s.base, `
		window.streamCalls = [];
		const real = window.fetch;
		window.fetch = (url, opts) => {
			if (String(url).includes("/stream")) {
				window.streamCalls.push(String(url));
				if (window.streamCalls.length === 1) {
					return Promise.resolve(new Response('event: end\ndata: {"reason":"closing"}\n\n', { status: 200, headers: { "Content-Type": "text/event-stream" } }));
				}
			}
			return real(url, opts);
		}`, "#/queue/chat/task/chat-2")
	tb.waitJS("the second connection, open", `window.streamCalls.length >= 2 && !!document.querySelector('#stream-status [data-open]')`)
	if from := eval[string](tb, `window.streamCalls[1]`); !strings.HasSuffix(from, "?from=1") {
		t.Fatalf("the reconnection asked %s, want from=1", from)
	}
	close(start)
	tb.waitJS("the end on done", `!!document.querySelector('#stream-status [data-ended="done"]')`)
	if text := eval[string](tb, `document.getElementById("stream-text").textContent`); text != "after the break" {
		t.Fatalf("the stream's text is %q", text)
	}
	tb.noConsoleErrors()
}

// TestUIDecisionSendsOneSignal: while Approve's signal is in flight, both
// buttons are disabled, so Reject clicked right after Approve sends
// nothing; the key sent is the wait's own (ui-{since}-{name}) and the
// task's inbox holds one signal. The first signal request is held until
// the test lets it go.
func TestUIDecisionSendsOneSignal(t *testing.T) {
	s := newSite(t)
	s.runWorker("review", func(w *queue.Worker, store *task.Store) {
		w.HandleAll(queue.Steps(store,
			task.Step{Name: "plan", Run: func(context.Context, []byte) ([]byte, error) { return nil, task.WaitSignal("approval", time.Hour) }},
			task.Step{Name: "act", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	})
	c := s.queueClient()
	if _, err := c.Submit(context.Background(), "review", []queue.Task{{ID: "plan-3", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	var since string
	if !etcdtest.Eventually(20*time.Second, func() bool {
		r := s.do("GET", "/v1/queues/review/tasks/plan-3", nil, 200)
		w, _ := r["waiting_for"].(map[string]any)
		since, _ = w["since"].(string)
		return r["current_status"] == "WAITING"
	}) {
		t.Fatal("the task does not wait")
	}
	tb := newTab(t)
	tb.openWith(s.base, `
		window.signalKeys = [];
		const real = window.fetch;
		window.fetch = (url, opts) => {
			if (opts && opts.method === "POST" && String(url).includes("/signals/")) {
				window.signalKeys.push(JSON.parse(opts.body).idempotency_key);
				if (window.signalKeys.length === 1) return new Promise((res) => { window.letGo = () => res(real(url, opts)); });
			}
			return real(url, opts);
		}`, "#/queue/review/task/plan-3")
	tb.click(`#waiting button[data-act="approve"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	tb.waitJS("the approval in flight", `window.signalKeys.length === 1`)
	if !eval[bool](tb, `document.querySelector('#waiting button[data-act="reject"]').disabled && document.querySelector('#waiting button[data-act="approve"]').disabled`) {
		t.Fatal("a button is enabled while the approval is in flight")
	}
	tb.do("click Reject", chromedp.Click(chromedp.CSS(`#waiting button[data-act="reject"]`)))
	if eval[bool](tb, `document.getElementById("confirm").open`) {
		t.Fatal("Reject asks for a confirmation while the approval is in flight")
	}
	eval[bool](tb, `(() => { window.letGo(); return true; })()`)
	tb.waitJS("the page says it woke", `!!document.querySelector('#decision [data-woke="true"]')`)
	sinceMs, err := time.Parse(time.RFC3339Nano, since)
	if err != nil {
		t.Fatal(err)
	}
	keys := eval[[]string](tb, `window.signalKeys`)
	want := "ui-" + strconv.FormatInt(sinceMs.UnixMilli(), 10) + "-approval"
	if len(keys) != 1 || keys[0] != want {
		t.Fatalf("the page sent keys %v, want one, %s", keys, want)
	}
	r := s.do("GET", "/v1/queues/review/tasks/plan-3", nil, 200)
	if sg, _ := r["signals"].([]any); len(sg) != 1 {
		t.Fatalf("the inbox holds %d signals, want 1: %v", len(sg), sg)
	}
	tb.noConsoleErrors()
}

// TestUIChildrenPagerSurvivesReload: the page of children shown after
// Next stays shown when the task page is read again (a listed child of
// another queue changed), and Previous and First go back.
func TestUIChildrenPagerSurvivesReload(t *testing.T) {
	s := newSite(t)
	c := childviewtest.Start(t, s.cli, s.ns, childviewtest.Kids(30, nil))
	childviewtest.Parent(t, c, "boss", 20*time.Second)
	tb := newTab(t)
	tb.do("open the parent", chromedp.Navigate(s.base+"/ui/#/queue/wf/task/boss"))
	tb.waitJS("the first page", `!!document.querySelector('tr[data-child="boss.1.0"]')`)
	tb.clickUntil(`#children button[data-act="children-next"]`, "the second page", `!!document.querySelector('tr[data-child="boss.1.29"]') && !document.querySelector('tr[data-child="boss.1.0"]')`)
	eval[bool](tb, `(() => { document.getElementById("children").dataset.old = "1"; return true; })()`)
	if _, err := c.Cancel(context.Background(), "boss.1.25"); err != nil {
		t.Fatal(err)
	}
	tb.waitJS("the second page, read again", `!document.querySelector("#children[data-old]") && !!document.querySelector('tr[data-child="boss.1.25"][data-status="CANCELLED"]')`)
	tb.clickUntil(`#children button[data-act="children-prev"]`, "the first page again", `!!document.querySelector('tr[data-child="boss.1.0"]') && !document.querySelector('tr[data-child="boss.1.29"]')`)
	tb.clickUntil(`#children button[data-act="children-next"]`, "the second page again", `!!document.querySelector('tr[data-child="boss.1.29"]')`)
	tb.clickUntil(`#children button[data-act="children-first"]`, "the first page from First", `!!document.querySelector('tr[data-child="boss.1.0"]') && !document.querySelector('#children button[data-act="children-first"]')`)
	tb.noConsoleErrors()
}

// TestUIChildrenNextSurvivesReloadDuringRead: a click on Next whose page
// is still being read when the task page is read again (a listed child's
// queue changed) still shows the next page, not the first. The page's
// read is held until the reload has happened.
func TestUIChildrenNextSurvivesReloadDuringRead(t *testing.T) {
	s := newSite(t)
	c := childviewtest.Start(t, s.cli, s.ns, childviewtest.Kids(30, nil))
	childviewtest.Parent(t, c, "boss", 20*time.Second)
	tb := newTab(t)
	tb.do("open the parent", chromedp.Navigate(s.base+"/ui/#/queue/wf/task/boss"))
	tb.waitJS("the first page", `!!document.querySelector('tr[data-child="boss.1.0"]')`)
	eval[bool](tb, `(() => {
		window.heldPages = 0;
		const real = window.fetch;
		window.fetch = (url, opts) => {
			if (String(url).includes("/children?") && window.heldPages++ === 0) {
				return new Promise((res) => { window.letPageGo = () => res(real(url, opts)); });
			}
			return real(url, opts);
		};
		document.getElementById("children").dataset.old = "1";
		return true;
	})()`)
	tb.click(`#children button[data-act="children-next"]`)
	tb.waitJS("the next page asked for", `window.heldPages === 1`)
	if _, err := c.Cancel(context.Background(), "boss.1.3"); err != nil {
		t.Fatal(err)
	}
	tb.waitJS("the task page read again", `!document.querySelector("#children[data-old]")`)
	eval[bool](tb, `(() => { window.letPageGo(); return true; })()`)
	tb.waitJS("the second page", `!!document.querySelector('tr[data-child="boss.1.29"]') && !document.querySelector('tr[data-child="boss.1.0"]')`)
	tb.noConsoleErrors()
}

// TestUIStreamFollowedOnlyWhenItMayEmit: the page of a task that ended
// opens no stream and offers Follow, which shows its stream to its end;
// Follow on a task that does not exist says so (a 404) and stops.
func TestUIStreamFollowedOnlyWhenItMayEmit(t *testing.T) {
	s := newSite(t)
	s.runWorker("chat", func(w *queue.Worker, _ *task.Store) {
		w.Handle("answer", func(ctx context.Context, _ *queue.Task) ([]byte, error) {
			return []byte(`"ok"`), stream.Token(ctx, "said before")
		})
	})
	c := s.queueClient()
	if _, err := c.Submit(context.Background(), "chat", []queue.Task{{ID: "chat-3", Type: "answer"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(20*time.Second, func() bool {
		return s.do("GET", "/v1/queues/chat/tasks/chat-3", nil, 200)["current_status"] == "SUCCEEDED"
	}) {
		t.Fatal("the task does not succeed")
	}
	tb := newTab(t)
	tb.openWith(s.base, `
		window.streamCalls = 0;
		const real = window.fetch;
		window.fetch = (url, opts) => {
			if (String(url).includes("/stream")) window.streamCalls++;
			return real(url, opts);
		}`, "#/queue/chat/task/chat-3")
	tb.waitJS("the task shown, with Follow", `document.getElementById("task").innerText.includes("SUCCEEDED") && !!document.querySelector('button[data-act="follow"]')`)
	if n := eval[int](tb, `window.streamCalls`); n != 0 {
		t.Fatalf("the page of an ended task opened %d streams", n)
	}
	tb.click(`button[data-act="follow"]`)
	tb.waitJS("the end on done", `!!document.querySelector('#stream-status [data-ended="done"]')`)
	if text := eval[string](tb, `document.getElementById("stream-text").textContent`); text != "said before" {
		t.Fatalf("the stream's text is %q", text)
	}
	eval[bool](tb, `(() => { location.hash = "#/queue/chat/task/nope"; return true; })()`)
	tb.click(`button[data-act="follow"]`)
	tb.waitJS("no such task", `!!document.querySelector('#stream-status [data-gone]') && document.getElementById("stream-status").innerText.includes("No such task")`)
	if n := eval[int](tb, `window.streamCalls`); n != 2 {
		t.Fatalf("the pages opened %d streams, want one each", n)
	}
	tb.noConsoleErrors()
}

// TestUILiveViewIsBounded: the live view keeps the last 500 events and
// the last 256 KiB of text, and says it trimmed earlier ones. The stream
// is made up: 510 events, then a token of 300,000 characters, then done.
func TestUILiveViewIsBounded(t *testing.T) {
	s := newSite(t)
	tb := newTab(t)
	tb.openWith(s.base, `
		const real = window.fetch;
		window.fetch = (url, opts) => {
			if (!String(url).includes("/stream")) return real(url, opts);
			let body = "";
			for (let i = 1; i <= 510; i++) body += "data: " + JSON.stringify({ seq: i, type: "note", data: { i } }) + "\n\n";
			body += "data: " + JSON.stringify({ seq: 511, type: "token", data: { text: "a" + "x".repeat(299998) + "z" } }) + "\n\n";
			body += 'event: end\ndata: {"reason":"done"}\n\n';
			return Promise.resolve(new Response(body, { status: 200, headers: { "Content-Type": "text/event-stream" } }));
		}`, "#/queue/chat/task/big")
	tb.click(`button[data-act="follow"]`)
	tb.waitJS("the end on done", `!!document.querySelector('#stream-status [data-ended="done"]')`)
	if n := eval[int](tb, `document.querySelectorAll("#stream-events li").length`); n != 500 {
		t.Fatalf("the list holds %d events, want 500", n)
	}
	if first := eval[string](tb, `document.querySelector("#stream-events li").innerText`); !strings.HasPrefix(first, "#11 ") {
		t.Fatalf("the first event listed is %q, want #11", first)
	}
	text := eval[string](tb, `document.getElementById("stream-text").textContent`)
	if len(text) > 256*1024 || !strings.HasSuffix(text, "xz") || strings.HasPrefix(text, "a") {
		t.Fatalf("the text holds %d characters, want its last 262144", len(text))
	}
	if !eval[bool](tb, `!document.getElementById("stream-trimmed").hidden`) {
		t.Fatal("the view does not say it trimmed")
	}
}
