package flow_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
)

// waitState waits until b sees state.
func waitState(t *testing.T, b *flow.Breaker, state string) {
	t.Helper()
	deadline := time.Now().Add(3 * time.Second)
	for b.State().State != state {
		if time.Now().After(deadline) {
			t.Fatalf("breaker is %s, want %s", b.State().State, state)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestBreakerSharedByProcesses: two handles (two workers) on one breaker.
// Failures through one open it for both; after the cooldown exactly one
// probe is let through; a failed probe opens it again, a good one closes it.
// Their clock is moved by hand.
func TestBreakerSharedByProcesses(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cfg := flow.BreakerConfig{Failures: 3, Cooldown: 300 * time.Millisecond}
	a, err := flow.NewBreaker(ctx, srv.Client(t), ns, "crm", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b, err := flow.NewBreaker(ctx, srv.Client(t), ns, "crm", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	clock := newFakeClock()
	flow.SetBreakerClock(a, clock.Now)
	flow.SetBreakerClock(b, clock.Now)
	// Two failures, a success, two failures: not consecutive, stays closed.
	for i, failed := range []bool{true, true, false, true, true} {
		if err := a.Record(ctx, "t", failed); err != nil {
			t.Fatal(err)
		}
		if a.State().State != flow.Closed {
			t.Fatalf("opened after call %d", i)
		}
	}
	if err := a.Record(ctx, "t", true); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, flow.Open) // the other process sees it
	var de *flow.DeferError
	if err := b.Allow(ctx, "x"); !errors.As(err, &de) || de.After <= 0 || de.After > 400*time.Millisecond {
		t.Fatalf("allow while open: %v", err)
	}
	clock.Add(cfg.Cooldown)
	// One probe only, whichever process asks first.
	errA, errB := a.Allow(ctx, "probe-a"), b.Allow(ctx, "probe-b")
	if (errA == nil) == (errB == nil) {
		t.Fatalf("after the cooldown: a %v, b %v; want exactly one probe", errA, errB)
	}
	probe, other := "probe-a", b
	if errA != nil {
		probe, other = "probe-b", a
	}
	waitState(t, other, flow.HalfOpen)
	// The probe fails: open again.
	if err := a.Record(ctx, probe, true); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, flow.Open)
	clock.Add(cfg.Cooldown)
	if err := b.Allow(ctx, "probe-2"); err != nil {
		t.Fatalf("second probe: %v", err)
	}
	if err := b.Record(ctx, "probe-2", false); err != nil {
		t.Fatal(err)
	}
	waitState(t, a, flow.Closed)
	if err := a.Allow(ctx, "y"); err != nil {
		t.Fatalf("allow once closed: %v", err)
	}
	if st := a.State(); st.Opened != 2 || st.Consecutive != 0 {
		t.Fatalf("state %+v, want opened twice, no failures counted", st)
	}
	// Reset closes an open breaker for everyone.
	for range 3 {
		_ = a.Record(ctx, "t", true)
	}
	waitState(t, b, flow.Open)
	if err := flow.ResetBreaker(ctx, srv.Client(t), ns, "crm"); err != nil {
		t.Fatal(err)
	}
	waitState(t, b, flow.Closed)
}

// TestBreakerRatio: with a ratio of 0.5 over a 1 s window (at least 10
// calls, one every 10 ms of the clock), failures mixed with successes open
// the breaker, which consecutive
// counting alone (threshold 1000) never would; successes reach etcd only in
// batched window counts.
func TestBreakerRatio(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cfg := flow.BreakerConfig{Failures: 1000, Cooldown: time.Minute, Ratio: 0.5, Window: time.Second, MinCalls: 10}
	a, err := flow.NewBreaker(ctx, srv.Client(t), ns, "llm", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close(context.Background())
	b, err := flow.NewBreaker(ctx, srv.Client(t), ns, "llm", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(context.Background())
	clock := newFakeClock()
	flow.SetBreakerClock(a, clock.Now)
	flow.SetBreakerClock(b, clock.Now)
	// 40 % failures: stays closed.
	for i := range 20 {
		if err := a.Record(ctx, "t", i%5 < 2); err != nil {
			t.Fatal(err)
		}
		clock.Add(10 * time.Millisecond)
	}
	if st := a.State(); st.State != flow.Closed {
		t.Fatalf("opened at a 40 %% failure ratio: %+v", st)
	}
	// 60 % failures from two processes: opens, for both.
	deadline := time.Now().Add(5 * time.Second)
	calls, failures := 20, 8
	for i := 0; a.State().State == flow.Closed; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("still closed at a 60 %% failure ratio: %+v", a.State())
		}
		br := a
		if i%2 == 1 {
			br = b
		}
		if err := br.Record(ctx, "t", i%5 < 3); err != nil {
			t.Fatal(err)
		}
		calls++
		if i%5 < 3 {
			failures++
		}
		clock.Add(10 * time.Millisecond)
	}
	waitState(t, b, flow.Open)
	if err := b.Allow(ctx, "x"); err == nil {
		t.Fatal("open breaker allowed a call")
	}
	g, err := srv.Client(t).Get(ctx, keyspace.MustNew(ns).BreakerState("llm"))
	if err != nil {
		t.Fatal(err)
	}
	// Failures are written one by one (the consecutive count), successes
	// only in the batched window counts.
	if v := g.Kvs[0].Version; v >= int64(calls) || v > int64(failures)+int64(calls)/3 {
		t.Fatalf("%d writes of the breaker state for %d calls (%d failed): successes are not batched", v, calls, failures)
	}
	t.Logf("%d calls (%d failed), %d writes of the breaker state", calls, failures, g.Kvs[0].Version)
	if err := (flow.BreakerConfig{Failures: 1, Cooldown: time.Second, Ratio: 1.5}).Check("breaker"); err == nil {
		t.Fatal("ratio 1.5 accepted")
	}
}
