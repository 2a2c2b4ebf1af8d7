package ui_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
)

// runWorker runs a worker of queue q on the site's etcd until the test
// ends; setup registers its handlers.
func (s *site) runWorker(q string, setup func(*queue.Worker, *task.Store)) {
	s.t.Helper()
	ctx := context.Background()
	store, err := task.NewStore(s.cli, s.ns)
	if err != nil {
		s.t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, s.cli, queue.WorkerConfig{Namespace: s.ns, Queue: q})
	if err != nil {
		s.t.Fatal(err)
	}
	setup(w, store)
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { _ = w.Run(rctx); close(ran) }()
	s.t.Cleanup(func() {
		stop()
		<-ran
		_ = w.Close(context.Background())
	})
}

// queueClient is a queue client of the site's namespace.
func (s *site) queueClient() *queue.Client {
	s.t.Helper()
	c, err := queue.NewClient(s.cli, s.ns)
	if err != nil {
		s.t.Fatal(err)
	}
	return c
}

// TestUIApproveWakesTask: the page of a task WAITING for a signal shows
// what it waits for and since when, and the tokens its step emitted;
// Approve (after its confirmation)
// sends the signal: the page says the task woke, the task's next step
// gets {"approved": true} (its result is that data), and the page lists
// the signal received, consumed. With DROVER_UI_SCREENSHOTS set it writes
// the waiting task's page there (task-workflow.png).
func TestUIApproveWakesTask(t *testing.T) {
	s := newSite(t)
	got := make(chan json.RawMessage, 1)
	s.runWorker("review", func(w *queue.Worker, store *task.Store) {
		w.HandleAll(queue.Steps(store,
			task.Step{Name: "plan", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
				for _, tok := range []string{"Plan: ", "drop the ", "old tables"} {
					if err := stream.Token(ctx, tok); err != nil {
						return nil, err
					}
				}
				return []byte("drop the old tables"), task.WaitSignal("approval", time.Hour)
			}},
			task.Step{Name: "act", Run: func(ctx context.Context, _ []byte) ([]byte, error) {
				sg, ok := task.ReceivedSignal(ctx)
				if !ok || sg.Name != "approval" {
					return nil, errors.New("the step after the wait got no approval")
				}
				select {
				case got <- sg.Data:
				default:
				}
				return sg.Data, nil
			}}))
	})
	c := s.queueClient()
	if _, err := c.Submit(context.Background(), "review", []queue.Task{{ID: "plan-1", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(20*time.Second, func() bool {
		return s.do("GET", "/v1/queues/review/tasks/plan-1", nil, 200)["current_status"] == "WAITING"
	}) {
		t.Fatal("the task does not wait")
	}

	tb := newTab(t)
	tb.do("open the task", chromedp.Navigate(s.base+"/ui/#/queue/review/task/plan-1"))
	tb.waitJS("what it waits for", `(document.getElementById("waits-for")||{}).innerText?.includes("the signal approval") && document.getElementById("waits-for").innerText.includes("since")`)
	tb.waitJS("the plan's tokens, live", `document.getElementById("stream-text").textContent === "Plan: drop the old tables"`)
	if dir := os.Getenv("DROVER_UI_SCREENSHOTS"); dir != "" {
		png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "task-workflow.png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tb.click(`#waiting button[data-act="approve"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	tb.click(`#confirm-ok`)
	tb.waitJS("the page says it woke", `!!document.querySelector('#decision [data-woke="true"]')`)
	select {
	case d := <-got:
		var v struct{ Approved *bool }
		if err := json.Unmarshal(d, &v); err != nil || v.Approved == nil || !*v.Approved {
			t.Fatalf("the next step got %s, want {\"approved\": true}", d)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the next step did not run after the approval")
	}
	if !etcdtest.Eventually(20*time.Second, func() bool {
		r := s.do("GET", "/v1/queues/review/tasks/plan-1", nil, 200)
		res, _ := r["result"].(map[string]any)
		return r["current_status"] == "SUCCEEDED" && res["approved"] == true
	}) {
		t.Fatal("the task did not succeed with the approval's data")
	}
	tb.waitJS("the signal received, consumed", `!!document.querySelector('tr[data-signal="approval"]') && document.querySelector('tr[data-signal="approval"]').innerText.includes("consumed")`)
	tb.waitJS("no wait left", `!document.getElementById("waiting")`)
	tb.noConsoleErrors()
}

// TestUIRejectErrors: Reject on a WAITING task's page says what the API
// refused: the task was cancelled meanwhile, so the signal is a 409,
// which the page shows as an error.
func TestUIRejectErrors(t *testing.T) {
	s := newSite(t)
	s.runWorker("review", func(w *queue.Worker, store *task.Store) {
		w.HandleAll(queue.Steps(store,
			task.Step{Name: "plan", Run: func(context.Context, []byte) ([]byte, error) { return nil, task.WaitSignal("approval", time.Hour) }},
			task.Step{Name: "act", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	})
	c := s.queueClient()
	if _, err := c.Submit(context.Background(), "review", []queue.Task{{ID: "plan-2", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(20*time.Second, func() bool {
		return s.do("GET", "/v1/queues/review/tasks/plan-2", nil, 200)["current_status"] == "WAITING"
	}) {
		t.Fatal("the task does not wait")
	}
	tb := newTab(t)
	tb.do("open the task", chromedp.Navigate(s.base+"/ui/#/queue/review/task/plan-2"))
	tb.click(`#waiting button[data-act="reject"]`)
	tb.waitJS("the confirmation", `document.getElementById("confirm").open`)
	// Cancelled while the confirmation is open: the page's reload cannot
	// take the button away before the click.
	if _, err := c.Cancel(context.Background(), "plan-2"); err != nil {
		t.Fatal(err)
	}
	tb.click(`#confirm-ok`)
	tb.waitJS("the refusal", `!!document.querySelector('#decision .error') && document.querySelector('#decision .error').innerText.includes("not sent")`)
	tb.noConsoleErrors()
}

// TestUILiveStream: the task page follows the task's stream while it is
// open: tokens emitted after the page opened are joined as text, the
// second attempt's boundary is shown after the first failed, and the view
// ends on done.
func TestUILiveStream(t *testing.T) {
	s := newSite(t)
	start := make(chan struct{})
	s.runWorker("chat", func(w *queue.Worker, _ *task.Store) {
		w.Handle("answer", func(ctx context.Context, tk *queue.Task) ([]byte, error) {
			select {
			case <-start:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
			if tk.Attempt == 1 {
				for _, tok := range []string{"Hel", "lo"} {
					if err := stream.Token(ctx, tok); err != nil {
						return nil, err
					}
				}
				return nil, errors.New("model overloaded")
			}
			if err := stream.Token(ctx, "world"); err != nil {
				return nil, err
			}
			return []byte(`"Hello world"`), nil
		})
	})
	c := s.queueClient()
	if _, err := c.Submit(context.Background(), "chat", []queue.Task{{ID: "chat-1", Type: "answer", BackoffBase: queue.Duration(10 * time.Millisecond),
		BackoffMax: queue.Duration(20 * time.Millisecond)}}, nil); err != nil {
		t.Fatal(err)
	}

	tb := newTab(t)
	tb.do("open the task", chromedp.Navigate(s.base+"/ui/#/queue/chat/task/chat-1"))
	tb.waitJS("the stream open, no event yet", `!!document.querySelector('#stream-status [data-open]') && document.getElementById("stream-events").children.length === 0`)
	close(start)
	tb.waitJS("the end on done", `!!document.querySelector('#stream-status [data-ended="done"]')`)
	text := eval[string](tb, `document.getElementById("stream-text").textContent`)
	if text != "Hello\n— attempt 2 —\nworld" {
		t.Fatalf("the stream's text is %q", text)
	}
	types := eval[[]string](tb, `[...document.querySelectorAll("#stream-events li")].map((li) => li.dataset.type)`)
	started, done := 0, 0
	for _, ty := range types {
		switch ty {
		case "attempt_started":
			started++
		case "done":
			done++
		}
	}
	if started != 2 || done != 1 || types[0] != "attempt_started" || types[len(types)-1] != "done" {
		t.Fatalf("the stream's events: %v; want two attempts started, ending on done", types)
	}
	tb.noConsoleErrors()
}

// TestUIChildrenTable: a parent's page lists its children with their
// states (one SUCCEEDED, one CANCELLED, one PENDING) and the counts; a
// child's page links to its parent.
func TestUIChildrenTable(t *testing.T) {
	s := newSite(t)
	c := s.queueClient()
	if err := c.SetConfig(context.Background(), "kids", queue.Config{}); err != nil { // no worker runs it
		t.Fatal(err)
	}
	s.runWorker("wf", func(w *queue.Worker, store *task.Store) {
		w.HandleAll(queue.Steps(store,
			task.Step{Name: "fan-out", Run: func(context.Context, []byte) ([]byte, error) {
				return nil, task.Spawn([]task.Child{{Queue: "kids", Type: "search"}, {Queue: "kids", Type: "search"}, {Queue: "kids", Type: "search"}},
					task.SpawnOptions{Collect: true})
			}},
			task.Step{Name: "fan-in", Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}))
	})
	if _, err := c.Submit(context.Background(), "wf", []queue.Task{{ID: "boss", Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	if !etcdtest.Eventually(20*time.Second, func() bool {
		return s.do("GET", "/v1/queues/wf/tasks/boss", nil, 200)["current_status"] == "WAITING"
	}) {
		t.Fatal("the parent does not wait")
	}
	sess := s.session()
	r := s.do("POST", "/v1/queues/kids/claim", map[string]any{"session": sess, "max": 1, "wait": "5s"}, 200)
	k := r["tasks"].([]any)[0].(map[string]any)
	acked := k["task_id"].(string)
	s.do("POST", "/v1/queues/kids/tasks/"+acked+"/ack", map[string]any{"session": sess, "token": k["token"]}, 200)
	cancelled := "boss.1.2"
	if acked == cancelled {
		cancelled = "boss.1.1"
	}
	s.do("POST", "/v1/queues/kids/tasks/"+cancelled+"/cancel", nil, 200)
	pending := map[string]bool{"boss.1.0": true, "boss.1.1": true, "boss.1.2": true}
	delete(pending, acked)
	delete(pending, cancelled)
	var live string
	for id := range pending {
		live = id
	}

	tb := newTab(t)
	tb.do("open the parent", chromedp.Navigate(s.base+"/ui/#/queue/wf/task/boss"))
	tb.waitJS("the children's states",
		`!!document.querySelector('tr[data-child="`+acked+`"][data-status="SUCCEEDED"]') && !!document.querySelector('tr[data-child="`+cancelled+`"][data-status="CANCELLED"]') && !!document.querySelector('tr[data-child="`+live+`"][data-status="PENDING"]')`)
	counts := eval[string](tb, `document.querySelector("#children .child-counts").innerText`)
	for _, want := range []string{"3 spawned", "1 succeeded", "1 failed", "1 not ended"} {
		if !strings.Contains(counts, want) {
			t.Fatalf("the counts say %q, want %q", counts, want)
		}
	}
	tb.waitJS("what it waits for", `document.getElementById("waits-for").innerText.includes("3 of the 3")`)
	tb.click(`tr[data-child="` + live + `"] a`)
	tb.waitJS("the child's parent link", `!!document.querySelector('#parent a[data-parent="boss"]') && document.querySelector('#parent a').getAttribute("href") === "#/queue/wf/task/boss"`)
	tb.noConsoleErrors()
}
