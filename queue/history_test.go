package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestClientHistory: Client.History reads the minutes a history recorder
// (as every drover server runs) closed: three tasks processed show in the
// minute they were counted in, an unknown queue is ErrNoQueue and another
// window an input error naming window.
func TestClientHistory(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
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
	submitN(t, c, "h", 3, nil)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "h", Concurrency: 2, Drain: true})
	w.Handle("x", func(ctx context.Context, task *queue.Task) ([]byte, error) { return nil, nil })
	runDrain(t, w)
	if !etcdtest.Eventually(30*time.Second, func() bool { return r.Unclosed("h").Processed == 3 }) {
		t.Fatalf("recorder counted %+v", r.Unclosed("h"))
	}
	m := time.Now().Truncate(time.Minute)
	if closed, err := r.CloseMinute(ctx, m); err != nil || !closed {
		t.Fatalf("close minute: %v %v", closed, err)
	}
	h, err := c.History(ctx, "h", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if h.Total.Processed != 3 || len(h.Minutes) != 60 || h.Latency.Count() != 3 {
		t.Fatalf("history: total %+v, %d minutes, latency %+v", h.Total, len(h.Minutes), h.Latency)
	}
	if _, err := c.History(ctx, "nope", time.Hour); !errors.Is(err, queue.ErrNoQueue) {
		t.Fatalf("unknown queue: %v", err)
	}
	var ie *drover.InputError
	if _, err := c.History(ctx, "h", 2*time.Hour); !errors.As(err, &ie) || ie.Field != "window" {
		t.Fatalf("bad window: %v", err)
	}
}
