package history_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/queue/history"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestRead: Read returns the minutes a history recorder (as every drover
// server runs) closed: three tasks processed show in the window's totals
// and latency; an unknown queue is queue.ErrNoQueue and another window an
// input error naming window.
func TestRead(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	ctx := context.Background()
	r, err := qstats.NewRecorder(qstats.Config{Client: cli, Namespace: ns, Manual: true})
	if err != nil {
		t.Fatal(err)
	}
	r.Start(ctx)
	t.Cleanup(func() { _ = r.Stop(context.Background()) })
	select {
	case <-r.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("recorder not ready")
	}
	process(t, cli, ns, "h", 3)
	if !etcdtest.Eventually(30*time.Second, func() bool { return r.Unclosed("h").Processed == 3 }) {
		t.Fatalf("recorder counted %+v", r.Unclosed("h"))
	}
	if closed, err := r.CloseMinute(ctx, time.Now().Truncate(time.Minute)); err != nil || !closed {
		t.Fatalf("close minute: %v %v", closed, err)
	}
	h, err := history.Read(ctx, cli, ns, "h", history.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if h.Total.Processed != 3 || len(h.Minutes) != 60 || h.Latency.Count() != 3 {
		t.Fatalf("history: total %+v, %d minutes, %d latency samples", h.Total, len(h.Minutes), h.Latency.Count())
	}
	if _, err := history.Read(ctx, cli, ns, "nope", history.Hour); !errors.Is(err, queue.ErrNoQueue) {
		t.Fatalf("unknown queue: %v", err)
	}
	var ie *drover.InputError
	if _, err := history.Read(ctx, cli, ns, "h", 2*time.Hour); !errors.As(err, &ie) || ie.Field != "window" {
		t.Fatalf("bad window: %v", err)
	}
}

// process submits n tasks to queue q and runs a draining worker over them.
func process(t *testing.T, cli *clientv3.Client, ns, q string, n int) {
	t.Helper()
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close(context.Background()) })
	tasks := make([]queue.Task, n)
	for i := range tasks {
		tasks[i] = queue.Task{ID: fmt.Sprintf("%s-%d", q, i), Type: "x"}
	}
	if _, err := c.Submit(context.Background(), q, tasks, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(context.Background(), cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 2, Drain: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = w.Close(context.Background()) })
	w.Handle("x", func(ctx context.Context, task *queue.Task) ([]byte, error) { return nil, nil })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := w.Run(ctx); err != nil || ctx.Err() != nil {
		t.Fatalf("worker: %v %v", err, ctx.Err())
	}
}
