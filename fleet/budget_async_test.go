package fleet_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestBudgetSettleAfterTheOutcome: the gate's settle does not hold the
// task: while it is held back (not sent), the task's outcome is written
// (SUCCEEDED), its reservation still held, and Flush waits; once it is
// sent, Flush returns and the budget counts what the handler reported,
// the reservation gone.
func TestBudgetSettleAfterTheOutcome(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	b := budget.New(cli, ns)
	defer b.Close()
	const key = "openai/gpt-4.1/key-async"
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	l, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Revoke(context.Background(), l.ID)
	gate := fleet.NewBudgetGate(b, func() clientv3.LeaseID { return l.ID }, nil)
	entered, release := make(chan struct{}, 1), make(chan struct{})
	fleet.SetBeforeSettle(gate, func() {
		entered <- struct{}{}
		<-release
	})
	qc, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := qc.Submit(ctx, "llm", []queue.Task{{ID: "a", Type: "chat", Metadata: queue.Metadata{Budget: key, EstimatedTokens: 40}}}, nil); err != nil {
		t.Fatal(err)
	}
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "llm", Concurrency: 1, Gates: []queue.Gate{gate}})
	if err != nil {
		t.Fatal(err)
	}
	w.HandleAll(func(_ context.Context, task *queue.Task) ([]byte, error) {
		gate.Used(task, 30)
		return nil, nil
	})
	rctx, stop := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- w.Run(rctx) }()
	released := false
	defer func() {
		if !released {
			close(release)
		}
		stop()
		<-ran
		_ = w.Close(context.Background())
		_ = gate.Flush(context.Background()) // no settle outlives the test
	}()
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the handler's settle did not begin within a minute")
	}
	waitFor(t, func() bool {
		task, err := qc.Get(ctx, "a")
		return err == nil && task.CurrentStatus == queue.Succeeded
	}, "the task's outcome written while its settle is held")
	if u, err := b.Get(ctx, key); err != nil || u.Reserved != 40 || u.Used != 0 {
		t.Fatalf("before the settle: %+v %v, want the 40 still reserved, none used", u, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	err = gate.Flush(short)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush with a settle held: %v, want it to wait", err)
	}
	close(release)
	released = true
	fctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := gate.Flush(fctx); err != nil {
		t.Fatal(err)
	}
	if u, err := b.Get(ctx, key); err != nil || u.Used != 30 || u.Reserved != 0 || u.Live != 0 {
		t.Fatalf("after the settle: %+v %v, want 30 used, nothing reserved", u, err)
	}
}

// heldSettle makes a fleet worker on a fresh namespace with budget key
// (1000 tokens) and has its gate admit task "a" (estimating 40) and end
// its handler: the settle begins and is held until release is closed
// (entered says it began). It returns the worker and the budget client.
func heldSettle(t *testing.T, key string) (w *fleet.Worker, b *budget.Client, release chan struct{}) {
	t.Helper()
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	b = budget.New(cli, ns)
	t.Cleanup(func() { b.Close() })
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 1000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	w, err := fleet.NewWorker(ctx, cli, fleet.Config{Worker: queue.WorkerConfig{Namespace: ns, Queue: "llm", TTL: 30 * time.Second}, Handler: noop})
	if err != nil {
		t.Fatal(err)
	}
	entered, release := make(chan struct{}, 1), make(chan struct{})
	fleet.SetBeforeSettle(w.Budgets(), func() {
		entered <- struct{}{}
		<-release
	})
	task := &queue.Task{ID: "a", Type: "chat", Token: 1, Attempt: 1, Metadata: queue.Metadata{Budget: key, EstimatedTokens: 40}}
	done, err := w.Budgets().Admit(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	w.Budgets().Used(task, 30)
	done(nil)
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("the settle did not begin within a minute")
	}
	return w, b, release
}

// TestWorkerCloseFlushesBudgetSettles: a worker closed without Run (its
// handler returned, its settle not yet sent) writes the settle before its
// lease goes: the budget counts the 30 tokens used, nothing left reserved.
// Without the flush, the lease's revocation would drop the reservation
// and the settle would find nothing to settle.
func TestWorkerCloseFlushesBudgetSettles(t *testing.T) {
	t.Parallel()
	const key = "openai/gpt-4.1/key-close-flush"
	w, b, release := heldSettle(t, key)
	closed := make(chan error, 1)
	go func() { closed <- w.Close(context.Background()) }()
	select {
	case err := <-closed:
		t.Errorf("Close returned while a settle was unwritten: %v", err)
	case <-time.After(200 * time.Millisecond): // Close waits: the settle is held
	}
	close(release)
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close did not return within a minute of the settle")
	}
	if u, err := b.Get(context.Background(), key); err != nil || u.Used != 30 || u.Reserved != 0 {
		t.Fatalf("after Close: %+v %v, want 30 used, nothing reserved", u, err)
	}
}

// TestWorkerCloseFlushBoundedByCtx: Close with a context that ended does
// not wait for a settle held back, however long a settle may take (an
// hour here): each of its steps is bounded by its context.
func TestWorkerCloseFlushBoundedByCtx(t *testing.T) { // not parallel: it sets the package's flush timeout
	defer fleet.SetFlushTimeout(time.Hour)()
	w, _, release := heldSettle(t, "openai/gpt-4.1/key-close-bounded")
	defer func() { // no settle outlives the test
		close(release)
		fctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := w.Budgets().Flush(fctx); err != nil {
			t.Error(err)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	closed := make(chan error, 1)
	go func() { closed <- w.Close(ctx) }()
	select {
	case <-closed:
	case <-time.After(time.Minute):
		t.Fatal("Close with an ended context still waits for a settle after a minute")
	}
}
