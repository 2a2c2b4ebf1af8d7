package queue_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// barrier releases its callers once n of them have arrived.
type barrier struct {
	mu   sync.Mutex
	n    int
	open chan struct{}
}

func newBarrier(n int) *barrier { return &barrier{n: n, open: make(chan struct{})} }

func (b *barrier) arrive(ctx context.Context) {
	b.mu.Lock()
	b.n--
	if b.n == 0 {
		close(b.open)
	}
	b.mu.Unlock()
	select {
	case <-b.open:
	case <-ctx.Done():
	}
}

// The outcomes of one segment's run, 60 tasks that fail and 40 that wait
// for 16 signals each, ending together, fit etcd's operation limit
// along every nesting path (a wait's conditional park is one level more):
// every task ends DEAD or WAITING, none stays RUNNING.
func TestWaitParksOfOneRunWithinTheTxnLimit(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	ctx := context.Background()
	none := 0
	in := make([]queue.Task, 100)
	for i := range in {
		in[i] = queue.Task{ID: fmt.Sprintf("t-%03d", i), Type: "agent", MaxRetries: &none}
	}
	if _, err := c.Submit(ctx, "q", in, nil); err != nil {
		t.Fatal(err)
	}
	names := make([]string, task.MaxWaitSignals)
	for i := range names {
		names[i] = fmt.Sprintf("signal-%02d", i)
	}
	step := task.Step{Name: "s1", Run: func(ctx context.Context, state []byte) ([]byte, error) {
		if queue.TaskIDOf(ctx) < "t-060" {
			return state, errors.New("fails")
		}
		return state, task.WaitSignals(0, names...)
	}}
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "q", Concurrency: len(in)})
	steps := queue.Steps(store, step, task.Step{Name: "s2", Run: func(_ context.Context, s []byte) ([]byte, error) { return s, nil }})
	// Every task's outcome is handed to the writer at once, so that the
	// run's outcomes are written together.
	b := newBarrier(len(in))
	w.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		res, err := steps(ctx, tk)
		b.arrive(context.Background())
		return res, err
	})
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = w.Run(runCtx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	waitUntil(t, "60 tasks DEAD and 40 WAITING", func() bool {
		st, err := c.Stats(ctx, "q")
		return err == nil && st.Dead == 60 && st.Waiting == 40 && st.Running == 0
	})
	got, err := c.Get(ctx, "t-070")
	if err != nil || got.WaitingFor == nil || strings.Join(got.WaitingFor.Signals, ",") != strings.Join(names, ",") {
		t.Fatalf("t-070: %+v (%v): want waiting for the 16 signals", got, err)
	}
}
