package fleet_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestTaskOutcome: the handler errors a queue worker gives a gate's done
// read as flow control read them before it had types of its own: a task
// that did not run, a failure that is the task's own fault, a cancellation
// and a shutdown say nothing about the resource; timeouts and transient
// failures count.
func TestTaskOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		err  error
		want flow.Outcome
	}{
		{"success", nil, flow.Succeeded},
		{"not run", queue.ErrNotRun, flow.NotRun},
		{"not run, wrapped", fmt.Errorf("gate 2: %w", queue.ErrNotRun), flow.NotRun},
		{"permanent", queue.Permanent(errors.New("bad input")), flow.Inconclusive},
		{"cancelled", queue.ErrCancelled, flow.Inconclusive},
		{"shutdown", fmt.Errorf("stopped: %w", queue.ErrShutdown), flow.Inconclusive},
		{"context cancelled", context.Canceled, flow.Inconclusive},
		{"timeout", fmt.Errorf("%w after 1s: %w", queue.ErrTimeout, context.DeadlineExceeded), flow.Failed},
		{"deadline", context.DeadlineExceeded, flow.Failed},
		{"transient", errors.New("crm answered 503"), flow.Failed},
		{"no handler", queue.ErrNoHandler, flow.Failed},
	} {
		if got := fleet.TaskOutcome(tc.err); got != tc.want {
			t.Errorf("%s: %v reads as %s, want %s", tc.name, tc.err, got, tc.want)
		}
	}
}

// fakeGate is a flow gate that answers as told and records what it saw.
type fakeGate struct {
	err   error
	done  bool // return a done, not nil
	calls []flow.Call
	heard []error
}

func (g *fakeGate) Admit(_ context.Context, c flow.Call) (func(error), error) {
	g.calls = append(g.calls, c)
	if g.err != nil {
		return nil, g.err
	}
	if !g.done {
		return nil, nil
	}
	return func(err error) { g.heard = append(g.heard, err) }, nil
}

// TestGateAdapter: a task is admitted as its call (id, type, tenant, read
// by TaskOutcome); a flow deferral becomes a queue deferral with the same
// reason, delay and text; other errors pass as they are; a gate that does
// not apply still gives a done, and a gate's done hears the handler's error
// itself.
func TestGateAdapter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	task := &queue.Task{ID: "t-1", Type: "chat", Metadata: queue.Metadata{Tenant: "acme", Priority: 5}}

	applies := &fakeGate{done: true}
	done, err := fleet.Gate(applies).Admit(ctx, task)
	if err != nil || done == nil {
		t.Fatalf("admit: %v, done %v", err, done != nil)
	}
	c := applies.calls[0]
	if c.ID != "t-1" || c.Type != "chat" || c.Tenant != "acme" || c.Outcome == nil || c.Outcome(queue.ErrNotRun) != flow.NotRun {
		t.Fatalf("call %+v", c)
	}
	handlerErr := errors.New("503")
	done(handlerErr)
	if len(applies.heard) != 1 || applies.heard[0] != handlerErr {
		t.Fatalf("done heard %v, want the handler's error", applies.heard)
	}

	done, err = fleet.Gate(&fakeGate{}).Admit(ctx, task)
	if err != nil || done == nil {
		t.Fatalf("a gate that does not apply: %v, done %v", err, done != nil)
	}
	done(nil) // harmless

	fd := &flow.DeferError{Reason: "quota tenant full", After: 750 * time.Millisecond}
	_, err = fleet.Gate(&fakeGate{err: fd}).Admit(ctx, task)
	var qd *queue.DeferError
	if !errors.As(err, &qd) || qd.Reason != fd.Reason || qd.After != fd.After || err.Error() != fd.Error() {
		t.Fatalf("deferral became %T %v, want a *queue.DeferError like %v", err, err, fd)
	}
	if !errors.Is(err, flow.ErrDeferred) || !errors.Is(err, drover.ErrDeferred) {
		t.Fatal("the queue's deferral is not the one deferral every part matches")
	}

	for _, other := range []error{context.Canceled, errors.New("flow: quota tenant: etcdserver: request timed out")} {
		if _, err := fleet.Gate(&fakeGate{err: other}).Admit(ctx, task); err != other {
			t.Fatalf("error %v became %v", other, err)
		}
	}
	if gs := fleet.Gates([]flow.Gate{applies, &fakeGate{}}); len(gs) != 2 {
		t.Fatalf("%d gates", len(gs))
	}
}

// TestGatesIgnoreTasksThatDidNotRun: when a later gate refuses a task, the
// earlier gates hear queue.ErrNotRun: the rate limit gets its token back
// and the breaker counts nothing; a real failure does count, and an open
// breaker or a full quota defers the task as a queue deferral.
func TestGatesIgnoreTasksThatDidNotRun(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	r, _ := flow.ParseRate("rate", "100/s")
	l, err := flow.NewLimiter(ctx, cli, ns, "api", &r)
	if err != nil {
		t.Fatal(err)
	}
	cfg := flow.BreakerConfig{Failures: 1, Cooldown: flow.DefaultBreaker.Cooldown}
	b, err := flow.NewBreaker(ctx, cli, ns, "crm", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	task := &queue.Task{ID: "t1", Type: "x"}
	for _, g := range []queue.Gate{fleet.Gate(flow.RateGate(l)), fleet.Gate(flow.BreakerGate(b))} {
		done, err := g.Admit(ctx, task)
		if err != nil {
			t.Fatal(err)
		}
		done(queue.ErrNotRun)
	}
	if st := b.State(); st.State != flow.Closed || st.Consecutive != 0 {
		t.Fatalf("breaker counted a task that did not run: %+v", st)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, used, err := flow.Usage(ctx, cli, ns, "api"); err != nil || used != 0 {
		t.Fatalf("usage %d (%v) after a task that did not run, want 0", used, err)
	}
	// A permanent failure is the task's own fault: not counted.
	done, err := fleet.Gate(flow.BreakerGate(b)).Admit(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	done(queue.Permanent(errors.New("bad input")))
	if st := b.State(); st.State != flow.Closed || st.Consecutive != 0 {
		t.Fatalf("breaker counted a permanent failure: %+v", st)
	}
	// A real failure does count.
	done, err = fleet.Gate(flow.BreakerGate(b)).Admit(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	done(errors.New("crm answered 503"))
	if st := b.State(); st.State != flow.Open {
		t.Fatalf("breaker %+v after its one allowed failure", st)
	}
	var de *queue.DeferError
	if _, err := fleet.Gate(flow.BreakerGate(b)).Admit(ctx, task); !errors.As(err, &de) || de.Reason != "breaker crm open" ||
		de.After <= 0 || de.After > cfg.Cooldown*11/10 {
		t.Fatalf("admit while open: %v", err)
	}
	// A full quota defers for about a second.
	lease, err := cli.Grant(ctx, 30)
	if err != nil {
		t.Fatal(err)
	}
	q, err := flow.NewQuota(ctx, cli, ns, flow.PerTenant, flow.QuotaConfig{Limit: 1}, func() clientv3.LeaseID { return lease.ID })
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close(context.Background())
	acme := &queue.Task{ID: "a1", Metadata: queue.Metadata{Tenant: "acme"}}
	if _, err := fleet.Gate(flow.QuotaGate(q)).Admit(ctx, acme); err != nil {
		t.Fatal(err)
	}
	_, err = fleet.Gate(flow.QuotaGate(q)).Admit(ctx, &queue.Task{ID: "a2", Metadata: queue.Metadata{Tenant: "acme"}})
	if !errors.As(err, &de) || de.Reason != "quota tenant full" || de.After < 500*time.Millisecond || de.After >= 1500*time.Millisecond {
		t.Fatalf("admit over quota: %v", err)
	}
}
