package ui_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// deferOnce defers each task of type "held" once, as a full quota would.
type deferOnce struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (g *deferOnce) Admit(_ context.Context, t *queue.Task) (func(error), error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if t.Type == "held" && !g.seen[t.ID] {
		g.seen[t.ID] = true
		return nil, &queue.DeferError{Reason: "quota", After: 10 * time.Millisecond}
	}
	return func(error) {}, nil
}

// historyMinutes runs n minutes of work through queue q of s: each minute
// a batch of tasks (some succeed, some fail for good, some fail once, some
// are deferred once) is submitted, the minute is closed (its record keeps
// the batch's depth), and a worker drains the queue. A recorder of the
// test's own closes the minutes, so that the test needs no wall clock.
// It returns the totals the history must show.
func historyMinutes(t *testing.T, s *site, q string, n int) qstats.Counts {
	t.Helper()
	ctx := context.Background()
	c, err := queue.NewClient(s.cli, s.ns)
	if err != nil {
		t.Fatal(err)
	}
	depth := func() map[string]qstats.Depth {
		st, err := c.Stats(ctx, q)
		if err != nil {
			return nil
		}
		return map[string]qstats.Depth{q: {Pending: st.Pending, Running: st.Running, Retrying: st.Retrying}}
	}
	rec, err := qstats.NewRecorder(qstats.Config{Client: s.cli, Namespace: s.ns, Manual: true, Depth: depth})
	if err != nil {
		t.Fatal(err)
	}
	rec.Start(ctx)
	t.Cleanup(func() { _ = rec.Stop(ctx) })
	<-rec.Ready()
	base := time.Now().UTC().Truncate(time.Minute).Add(-time.Duration(n+1) * time.Minute)
	var want qstats.Counts
	gate := &deferOnce{seen: map[string]bool{}}
	for i := range n {
		var tasks []queue.Task
		add := func(kind string, k int) {
			for j := range k {
				tasks = append(tasks, queue.Task{ID: fmt.Sprintf("h%d-%s-%d", i, kind, j), Type: kind,
					BackoffBase: queue.Duration(10 * time.Millisecond), BackoffMax: queue.Duration(20 * time.Millisecond)})
			}
		}
		ok, dead, flaky, held := 6+(i*7)%13, i%3, (i*5)%4, i%2
		add("ok", ok)
		add("dead", dead)
		add("flaky", flaky)
		add("held", held)
		want.Processed += int64(ok + flaky + held)
		want.Failed += int64(dead)
		want.Retried += int64(flaky)
		want.Deferred += int64(held)
		if _, err := c.Submit(ctx, q, tasks, nil); err != nil {
			t.Fatal(err)
		}
		_, _ = rec.CloseMinute(ctx, base.Add(time.Duration(i)*time.Minute)) // the server's recorder may close one first
		w, err := queue.NewWorker(ctx, s.cli, queue.WorkerConfig{Namespace: s.ns, Queue: q, Concurrency: 8, Drain: true, Gates: []queue.Gate{gate}})
		if err != nil {
			t.Fatal(err)
		}
		done := func(context.Context, *queue.Task) ([]byte, error) { return nil, nil }
		w.Handle("ok", done)
		w.Handle("held", done)
		w.Handle("dead", func(context.Context, *queue.Task) ([]byte, error) {
			return nil, queue.Permanent(errors.New("bad input"))
		})
		w.Handle("flaky", func(_ context.Context, t *queue.Task) ([]byte, error) {
			if t.Attempt == 1 {
				return nil, errors.New("try again")
			}
			return nil, nil
		})
		err = w.Run(ctx)
		w.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	// The rest goes into the minute under way (or the server's recorder
	// closed it); wait until the history counts every task.
	if !etcdtest.Eventually(90*time.Second, func() bool {
		_, _ = rec.CloseMinute(ctx, time.Now())
		var h struct {
			Totals struct{ Processed, Failed, Retried, Deferred int64 } `json:"totals"`
		}
		raw, _ := json.Marshal(s.do("GET", "/v1/queues/"+q+"/history", nil, 200))
		_ = json.Unmarshal(raw, &h)
		return h.Totals.Processed == want.Processed && h.Totals.Failed == want.Failed && h.Totals.Retried == want.Retried && h.Totals.Deferred == want.Deferred
	}) {
		t.Fatalf("the history never counted %+v", want)
	}
	return want
}

// The queue page shows the queue's history: totals as counted, three
// charts, and a switch between the last hour and the last day. With
// DROVER_UI_SCREENSHOTS set it runs 30 minutes of work and writes
// queue-history.png there.
func TestUIQueueHistory(t *testing.T) {
	dir := os.Getenv("DROVER_UI_SCREENSHOTS")
	n := 3
	if dir != "" {
		n = 30
	}
	s := newSite(t)
	want := historyMinutes(t, s, "emails", n)
	tb := newTab(t)
	tb.do("open the queue page", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(s.base+"/ui/#/queue/emails"))
	total := func(k string, v int64) string {
		return fmt.Sprintf(`document.querySelector('#history [data-total="%s"]')?.textContent === "%d"`, k, v)
	}
	tb.waitJS("the history's totals", total("processed", want.Processed)+" && "+total("failed", want.Failed)+" && "+
		total("retried", want.Retried)+" && "+total("deferred", want.Deferred))
	if got := eval[int](tb, `document.querySelectorAll("#history svg.history-chart").length`); got != 3 {
		t.Errorf("%d charts, want 3 (tasks per minute, depth, latency)", got)
	}
	if p50 := eval[string](tb, `document.querySelector('#history [data-total="p50"]').textContent`); p50 == "–" {
		t.Error("no latency shown")
	}
	if dir != "" {
		tb.do("let it draw", chromedp.Sleep(500*time.Millisecond))
		png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "queue-history.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tb.click(`#history button[data-window="24h"]`)
	tb.waitJS("the day's window", `document.querySelector('#history button[data-window="24h"]').getAttribute("aria-pressed") === "true" && `+
		total("processed", want.Processed))
	tb.noConsoleErrors()
}

// The latency lines leave a gap at the minutes without samples (not a
// drop to 0), and a switch of the window while the other window's answer
// is on its way draws the window switched to, not the late answer.
func TestUIQueueHistoryGapsAndLateAnswer(t *testing.T) {
	s := newSite(t)
	want := historyMinutes(t, s, "gaps", 1)
	tb := newTab(t)
	tb.do("open the queue page", chromedp.EmulateViewport(1280, 900), chromedp.Navigate(s.base+"/ui/#/queue/gaps"))
	tb.waitJS("the history's totals", fmt.Sprintf(`document.querySelector('#history [data-total="processed"]')?.textContent === "%d"`, want.Processed))
	// Points joined by a line in a chart's first path.
	const joined = `(document.querySelectorAll("#history svg.history-chart")[%d].querySelector("path.line")?.getAttribute("d") || "").split("L").length - 1`
	if got := eval[int](tb, fmt.Sprintf(joined, 2)); got >= 59 {
		t.Errorf("the p50 line joins %d minutes of an hour where at most a few had samples", got)
	}
	// The day's answer is held until the hour's is drawn.
	eval[bool](tb, `(() => {
		window.__hold = new Promise((r) => { window.__release = r; });
		const orig = window.fetch;
		window.fetch = async (url, init) => {
			if (!String(url).includes("window=24h")) return orig(url, init);
			const r = await orig(url, init);
			const text = await r.text();
			await window.__hold;
			return { status: r.status, ok: r.ok, text: async () => { setTimeout(() => { window.__late = true; }); return text; } };
		};
		return true;
	})()`)
	eval[bool](tb, `(document.querySelector("#history svg.history-chart").dataset.old = "1", true)`)
	tb.click(`#history button[data-window="24h"]`)
	tb.click(`#history button[data-window="1h"]`)
	tb.waitJS("the hour drawn again", `document.querySelector('#history button[data-window="1h"]').getAttribute("aria-pressed") === "true" && `+
		`!document.querySelector("#history svg.history-chart").dataset.old`)
	eval[bool](tb, `(window.__release(), true)`)
	tb.waitJS("the day's answer handled", `window.__late === true`)
	if got := eval[int](tb, fmt.Sprintf(joined, 0)); got != 59 {
		t.Errorf("the hour is chosen; the chart joins %d minutes (59: the hour; 1439: the late day)", got)
	}
	tb.noConsoleErrors()
}
