package flow_test

import (
	"context"
	"errors"
	"testing"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// errRefused stands for what a caller's later gate refusing a call looks
// like; the call's Outcome reads it as NotRun.
var errRefused = errors.New("refused by a later gate")

func readRefused(err error) flow.Outcome {
	if errors.Is(err, errRefused) {
		return flow.NotRun
	}
	return flow.DefaultOutcome(err)
}

// TestGatesIgnoreCallsThatDidNotRun: when a later gate refuses a call, the
// earlier gates hear NotRun: the rate limit gets its token back and the
// breaker counts nothing.
func TestGatesIgnoreCallsThatDidNotRun(t *testing.T) {
	t.Parallel()
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
	call := flow.Call{ID: "t1", Type: "x", Outcome: readRefused}
	for _, g := range []flow.Gate{flow.RateGate(l), flow.BreakerGate(b)} {
		done, err := g.Admit(ctx, call)
		if err != nil {
			t.Fatal(err)
		}
		done(errRefused)
	}
	if st := b.State(); st.State != flow.Closed || st.Consecutive != 0 {
		t.Fatalf("breaker counted a call that did not run: %+v", st)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, used, err := flow.Usage(ctx, srv.Client(t), ns, "api"); err != nil || used != 0 {
		t.Fatalf("usage %d (%v) after a call that did not run, want 0", used, err)
	}
	// A real failure does count.
	done, err := flow.BreakerGate(b).Admit(ctx, call)
	if err != nil {
		t.Fatal(err)
	}
	done(errors.New("crm answered 503"))
	if st := b.State(); st.State != flow.Open {
		t.Fatalf("breaker %+v after its one allowed failure", st)
	}
}
