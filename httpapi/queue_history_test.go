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
	ok := etcdtest.Eventually(30*time.Second, func() bool {
		_, _ = rec.CloseMinute(ctx, time.Now())
		if err := json.Unmarshal(a.do("GET", "/v1/queues/"+q+"/history?window=1h", nil).want(t, 200).Raw, &h); err != nil {
			t.Fatal(err)
		}
		return h.Totals.Processed == 7 && h.Totals.Failed == 1
	})
	if !ok {
		t.Fatalf("totals %+v, want 7 processed and 1 failed", h.Totals)
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
	ok := etcdtest.Eventually(30*time.Second, func() bool {
		_, _ = rec.CloseMinute(ctx, time.Now())
		ra := a.do("GET", "/v1/queues/"+q+"/history?window=24h", nil).want(t, 200).Raw
		rb := b.do("GET", "/v1/queues/"+q+"/history?window=24h", nil).want(t, 200).Raw
		if json.Unmarshal(ra, &ha) != nil || json.Unmarshal(rb, &hb) != nil {
			return false
		}
		return ha.Totals.Processed == 5 && string(ra) == string(rb)
	})
	if !ok {
		t.Fatalf("server a: %+v, server b: %+v", ha.Totals, hb.Totals)
	}
}
