package flow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// TestGatesIgnoreTasksThatDidNotRun: when a later gate refuses a task, the
// earlier gates hear queue.ErrNotRun: the rate limit gets its token back
// and the breaker counts nothing.
func TestGatesIgnoreTasksThatDidNotRun(t *testing.T) {
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	r, _ := flow.ParseRate("rate", "100/s")
	l := newLimiter(t, ns, "api", &r)
	cfg := flow.BreakerConfig{Failures: 1, Cooldown: flow.DefaultBreaker.Cooldown}
	b, err := flow.NewBreaker(ctx, srv.Client(t), ns, "crm", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	task := &queue.Task{ID: "t1", Type: "x"}
	for _, g := range []queue.Gate{flow.RateGate(l), flow.BreakerGate(b)} {
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
	if _, used, err := flow.Usage(ctx, srv.Client(t), ns, "api"); err != nil || used != 0 {
		t.Fatalf("usage %d (%v) after a task that did not run, want 0", used, err)
	}
	// A real failure does count.
	done, err := flow.BreakerGate(b).Admit(ctx, task)
	if err != nil {
		t.Fatal(err)
	}
	done(errors.New("crm answered 503"))
	if st := b.State(); st.State != flow.Open {
		t.Fatalf("breaker %+v after its one allowed failure", st)
	}
}
