package queue_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// An exec step writes its sleep and its checkpoint commits; the worker is
// stopped before the outcome is written, so the task is handed back as
// attempt 1, with no SLEEPING transition. The next worker must still find
// the checkpoint: the command does not run step 1 again.
func TestExecSleepHandedBackKeepsCheckpoint(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	clock := newStillClock()
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "$DROVER_STEP" >> ` + log + `; if [ "$DROVER_STEP" = 1 ]; then echo 1h > "$DROVER_SLEEP_FILE"; fi; echo out$DROVER_STEP`
	exec := queue.ExecHandler([]string{"/bin/sh", "-c", script}, 0, time.Second, nil)
	if _, err := c.Submit(context.Background(), "q", []queue.Task{{ID: "ex", Type: "x"}}, nil); err != nil {
		t.Fatal(err)
	}
	a := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	queue.SetWorkerClock(a, clock.now)
	var first atomic.Bool
	a.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		out, err := exec(ctx, tk)
		if first.CompareAndSwap(false, true) {
			go func() { _ = a.StopAndCancel(context.Background()) }()
			<-ctx.Done() // the shutdown lands between the checkpoint and the outcome
		}
		return out, err
	})
	ran := make(chan struct{})
	go func() { _ = a.Run(context.Background()); close(ran) }()
	<-ran
	b := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: 1})
	queue.SetWorkerClock(b, clock.now)
	b.HandleAll(exec)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	waitUntil(t, "the task to sleep", func() bool {
		got, err := c.Get(context.Background(), "ex")
		return err == nil && got.CurrentStatus == queue.Sleeping
	})
	b2, _ := os.ReadFile(log)
	if runs := strings.Fields(string(b2)); len(runs) != 1 {
		t.Fatalf("the exec command ran as steps %v: step 1, checkpointed, ran again", runs)
	}
}
