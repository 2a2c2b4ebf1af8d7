package httpapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The queue's history over HTTP: the window's buckets and totals, counted
// exactly; the server's metrics move; bad input is refused.
func TestQueueHistoryRoute(t *testing.T) {
	a := newAPI(t)
	q := fmt.Sprintf("hist-%d", time.Now().UnixNano())
	ctx := context.Background()
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	a.do("GET", "/v1/queues/"+q+"/history", nil).want(t, 404)
	// A recorder of the test's own besides the server's: it closes the
	// minute under way, so the test does not wait for the clock. Either
	// may close a minute; each event is counted once.
	rec, err := qstats.NewRecorder(qstats.Config{Client: a.cli, Namespace: a.ns, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	rec.Start(ctx)
	defer rec.Stop(ctx)
	<-rec.Ready()
	a.do("GET", "/v1/stats/history", nil).want(t, 200) // the server's own recorder starts with its hub
	var tasks []queue.Task
	for i := range 7 {
		tasks = append(tasks, queue.Task{ID: fmt.Sprintf("ok-%d", i), Type: "ok"})
	}
	tasks = append(tasks, queue.Task{ID: "bad", Type: "bad"})
	if _, err := c.Submit(ctx, q, tasks, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: q, Concurrency: 4, Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	w.Handle("ok", func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	w.Handle("bad", func(context.Context, *queue.Task) ([]byte, error) { return nil, queue.Permanent(errors.New("no")) })
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var h httpapi.QueueHistory
	read := func() httpapi.QueueHistoryCounts {
		if err := json.Unmarshal(a.do("GET", "/v1/queues/"+q+"/history?window=1h", nil).want(t, 200).Raw, &h); err != nil {
			t.Fatal(err)
		}
		return h.Totals
	}
	want := httpapi.QueueHistoryCounts{Processed: 7, Failed: 1, Started: 8}
	ok := etcdtest.Eventually(historyWait, func() bool {
		u := rec.Unclosed(q)
		if got := read(); got != want {
			closeWhenHeld(ctx, rec, u, got, want)
		}
		return read() == want
	})
	if !ok {
		t.Fatalf("totals %+v, want %+v (unclosed %+v)", h.Totals, want, rec.Unclosed(q))
	}
	if len(h.Buckets) != 60 || h.Bucket != 60 || h.Window != 3600 || h.ClosedThrough == nil || h.Latency.Samples != 8 || h.Totals.Retried != 0 {
		t.Errorf("history %d buckets of %v s over %v s, closed through %v, latency %+v", len(h.Buckets), h.Bucket, h.Window, h.ClosedThrough, h.Latency)
	}
	if !etcdtest.Eventually(30*time.Second, func() bool {
		return testutil.ToFloat64(metrics.QueueProcessed.WithLabelValues(q)) == 7 && testutil.ToFloat64(metrics.QueueFailed.WithLabelValues(q)) == 1
	}) {
		t.Errorf("drover_queue_processed_total %v, drover_queue_failed_total %v", testutil.ToFloat64(metrics.QueueProcessed.WithLabelValues(q)),
			testutil.ToFloat64(metrics.QueueFailed.WithLabelValues(q)))
	}
	var day httpapi.QueueHistory
	if err := json.Unmarshal(a.do("GET", "/v1/queues/"+q+"/history?window=24h", nil).want(t, 200).Raw, &day); err != nil {
		t.Fatal(err)
	}
	if len(day.Buckets) != 1440 || day.Totals != h.Totals {
		t.Errorf("a day: %d buckets, totals %+v", len(day.Buckets), day.Totals)
	}
	a.do("GET", "/v1/queues/"+q+"/history?window=2h", nil).want(t, 400)
	a.do("GET", "/v1/queues/bad%20name/history", nil).want(t, 400)
}

// Two servers in front of one etcd answer the same history.
func TestQueueHistoryTwoServersAgree(t *testing.T) {
	a := newAPI(t)
	cfg := httpapi.Config{Etcd: srv.LocalClient(t), Namespace: a.ns, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		MaxWait: 10 * time.Second, RequestTimeout: time.Minute}
	b := startAPI(t, cfg)
	ctx := context.Background()
	const q = "twice"
	c, err := queue.NewClient(a.cli, a.ns)
	if err != nil {
		t.Fatal(err)
	}
	rec, err := qstats.NewRecorder(qstats.Config{Client: a.cli, Namespace: a.ns, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	rec.Start(ctx)
	defer rec.Stop(ctx)
	<-rec.Ready()
	var tasks []queue.Task
	for i := range 5 {
		tasks = append(tasks, queue.Task{ID: fmt.Sprintf("t-%d", i), Type: "ok"})
	}
	if _, err := c.Submit(ctx, q, tasks, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, a.cli, queue.WorkerConfig{Namespace: a.ns, Queue: q, Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close(ctx)
	w.Handle("ok", func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	if err := w.Run(ctx); err != nil {
		t.Fatal(err)
	}
	var ha, hb httpapi.QueueHistory
	want := httpapi.QueueHistoryCounts{Processed: 5, Started: 5}
	ok := etcdtest.Eventually(historyWait, func() bool {
		u := rec.Unclosed(q)
		ra := a.do("GET", "/v1/queues/"+q+"/history?window=24h", nil).want(t, 200).Raw
		if json.Unmarshal(ra, &ha) == nil && ha.Totals != want {
			closeWhenHeld(ctx, rec, u, ha.Totals, want)
		}
		ra = a.do("GET", "/v1/queues/"+q+"/history?window=24h", nil).want(t, 200).Raw
		rb := b.do("GET", "/v1/queues/"+q+"/history?window=24h", nil).want(t, 200).Raw
		if json.Unmarshal(ra, &ha) != nil || json.Unmarshal(rb, &hb) != nil {
			return false
		}
		return ha.Totals == want && string(ra) == string(rb)
	})
	if !ok {
		t.Fatalf("server a: %+v, server b: %+v", ha.Totals, hb.Totals)
	}
}

// historyWait bounds the wait for a queue's history: a whole minute and
// more, in case a minute is closed short anyway (see closeWhenHeld).
const historyWait = 90 * time.Second

// closeWhenHeld closes the minute under way with the test's recorder rec
// once rec holds every count not closed yet: u (rec's counts not closed,
// read first) and closed (the history's totals, read after) make want. A
// minute closed short, its watch behind the worker on a loaded machine,
// could not be closed again, and the rest would wait for the next minute.
// A minute the server's recorder closes between the two reads is counted
// twice in the sum, never missed, so the sum never says want too early.
func closeWhenHeld(ctx context.Context, rec *qstats.Recorder, u qstats.Counts, closed, want httpapi.QueueHistoryCounts) {
	sum := httpapi.QueueHistoryCounts{Processed: closed.Processed + u.Processed, Failed: closed.Failed + u.Failed,
		Retried: closed.Retried + u.Retried, Deferred: closed.Deferred + u.Deferred, Started: closed.Started + u.Started}
	if sum == want {
		_, _ = rec.CloseMinute(ctx, time.Now())
	}
}
