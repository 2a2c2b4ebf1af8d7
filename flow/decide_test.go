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

// TestTakeTokensByClock: the shared bucket's decisions follow the clock it
// is refilled by: a full bucket grants its burst, an empty one says exactly
// how long until it holds what was asked for, and refills to its burst, no
// further; a clock that runs backwards takes nothing away.
func TestTakeTokensByClock(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	if err := flow.SetRate(ctx, cli, ns, "api", flow.Rate{Events: 10, Per: time.Second, Burst: 5}); err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	take := func(n int64) flow.TakeResult {
		t.Helper()
		res, err := flow.TakeTokensAt(ctx, cli, ns, "api", n, clock.Now)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	if res := take(5); !res.Granted || res.Usage.Available != 0 || res.Usage.Used != 5 {
		t.Fatalf("the burst from a full bucket: %+v", res)
	}
	if res := take(1); res.Granted || res.RetryIn != 100*time.Millisecond+time.Millisecond {
		t.Fatalf("one token from an empty bucket at 10/s: %+v, want a retry in 101 ms", res)
	}
	clock.Add(50 * time.Millisecond)
	if res := take(1); res.Granted || res.RetryIn != 50*time.Millisecond+time.Millisecond {
		t.Fatalf("half a token refilled: %+v, want a retry in 51 ms", res)
	}
	clock.Add(50 * time.Millisecond)
	if res := take(1); !res.Granted || res.Usage.Used != 6 {
		t.Fatalf("one token refilled: %+v", res)
	}
	clock.Add(-time.Hour)
	if res := take(1); res.Granted || res.Usage.Available != 0 {
		t.Fatalf("a clock an hour back: %+v, want the bucket as it was", res)
	}
	clock.Add(2 * time.Hour)
	if res := take(1); !res.Granted || res.Usage.Available != 4 {
		t.Fatalf("an hour later: %+v, want a full bucket (5) less one", res)
	}
	if _, err := flow.TakeTokensAt(ctx, cli, ns, "api", 6, clock.Now); !errors.Is(err, flow.ErrExceedsBurst) {
		t.Fatalf("more than the burst: %v", err)
	}
}

// TestLimiterByClock: a limiter takes its tokens in batches of a tenth of a
// second's worth, so 100 reservations at 100/s make 10 bucket writes; once
// the bucket is empty a reservation waits (here: its context ends first)
// until the clock has refilled a batch; Close gives back what it holds.
func TestLimiterByClock(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	r := flow.Rate{Events: 100, Per: time.Second, Burst: 100}
	l, err := flow.NewLimiter(ctx, cli, ns, "api", &r)
	if err != nil {
		t.Fatal(err)
	}
	clock := newFakeClock()
	flow.SetLimiterClock(l, clock.Now)
	for i := range 100 {
		res, err := l.Reserve(ctx, 1)
		if err != nil {
			t.Fatalf("reservation %d: %v", i+1, err)
		}
		res.Settle(1)
	}
	state := keyspace.MustNew(ns).LimitState("api")
	if g, err := cli.Get(ctx, state); err != nil || g.Kvs[0].Version != 10 {
		t.Fatalf("bucket written %d times for 100 tokens (%v), want 10 batches of 10", g.Kvs[0].Version, err)
	}
	// The clock stands still: the reservation waits until its context
	// ends, and takes nothing from the bucket meanwhile.
	bounded, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = l.Reserve(bounded, 1)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a reservation from an empty bucket: %v, want it to wait until its context ends", err)
	}
	if g, err := cli.Get(ctx, state); err != nil || g.Kvs[0].Version != 10 {
		t.Fatalf("the bucket was written while empty (version %d, %v), want still 10", g.Kvs[0].Version, err)
	}
	clock.Add(100 * time.Millisecond) // one batch refilled
	res, err := l.Reserve(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	res.Settle(3) // used more than it reserved: a debt of 2
	if _, err := l.Reserve(ctx, 101); !errors.Is(err, flow.ErrExceedsBurst) {
		t.Fatalf("more than the burst: %v", err)
	}
	if err := l.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if _, used, err := flow.Usage(ctx, cli, ns, "api"); err != nil || used != 103 {
		t.Fatalf("used %d (%v), want the 103 settled", used, err)
	}
}

// TestBreakerByClock: an open breaker defers calls for the rest of its
// cooldown (jittered by at most a tenth), then lets one probe through; a
// probe that never reports is replaced after another cooldown, a late
// success of the replaced probe closes nothing, a failed probe opens the
// breaker again and a good one closes it.
func TestBreakerByClock(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cfg := flow.BreakerConfig{Failures: 2, Cooldown: 10 * time.Second}
	b, err := flow.NewBreaker(ctx, srv.Client(t), ns, "crm", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	clock := newFakeClock()
	flow.SetBreakerClock(b, clock.Now)
	record := func(id string, failed bool) {
		t.Helper()
		if err := b.Record(ctx, id, failed); err != nil {
			t.Fatal(err)
		}
	}
	deferred := func(id string, least time.Duration) {
		t.Helper()
		err := b.Allow(ctx, id)
		var de *flow.DeferError
		if !errors.As(err, &de) || !errors.Is(err, flow.ErrDeferred) || de.Reason != "breaker crm open" ||
			de.After < least || de.After > least+least/10+1 {
			t.Fatalf("allow %s: %v, want a deferral of %s to %s", id, err, least, least+least/10)
		}
	}
	allowed := func(id string) {
		t.Helper()
		if err := b.Allow(ctx, id); err != nil {
			t.Fatalf("allow %s: %v", id, err)
		}
	}
	record("a", true)
	if st := b.State(); st.State != flow.Closed || st.Consecutive != 1 {
		t.Fatalf("after one failure of two: %+v", st)
	}
	record("b", true)
	if st := b.State(); st.State != flow.Open || !st.Since.Equal(clock.Now()) || st.Opened != 1 {
		t.Fatalf("after two failures: %+v", st)
	}
	clock.Add(4 * time.Second)
	deferred("c", 6*time.Second)
	clock.Add(6*time.Second - 10*time.Millisecond)
	deferred("c", 50*time.Millisecond) // never less than 50 ms
	clock.Add(10 * time.Millisecond)
	allowed("probe-1")
	if st := b.State(); st.State != flow.HalfOpen || st.Probe != "probe-1" {
		t.Fatalf("after the cooldown: %+v, want probe-1 half-open", st)
	}
	deferred("d", cfg.Cooldown/4) // one probe at a time
	clock.Add(cfg.Cooldown)       // probe-1 never reported
	allowed("probe-2")
	record("probe-1", false) // too late: probe-2 decides
	if st := b.State(); st.State != flow.HalfOpen || st.Probe != "probe-2" {
		t.Fatalf("after the replaced probe's success: %+v", st)
	}
	record("probe-2", true)
	if st := b.State(); st.State != flow.Open || st.Opened != 2 {
		t.Fatalf("after the probe failed: %+v", st)
	}
	clock.Add(cfg.Cooldown)
	allowed("probe-3")
	record("probe-3", false)
	if st := b.State(); st.State != flow.Closed || st.Consecutive != 0 || st.Opened != 2 {
		t.Fatalf("after the probe succeeded: %+v", st)
	}
	allowed("e")
}

// TestBreakerRatioByClock: with a failure ratio, calls are counted locally
// and added to the fleet's window at most every tenth of the window (by the
// clock), so successes alone write nothing between flushes; the breaker
// opens when a flush brings the window's ratio to the threshold, long
// before the consecutive count would.
func TestBreakerRatioByClock(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	cfg := flow.BreakerConfig{Failures: 1000, Cooldown: time.Minute, Ratio: 0.5, Window: 10 * time.Second, MinCalls: 4}
	b, err := flow.NewBreaker(ctx, cli, ns, "llm", &cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close(ctx)
	clock := newFakeClock()
	flow.SetBreakerClock(b, clock.Now)
	key := keyspace.MustNew(ns).BreakerState("llm")
	writes := func() int64 {
		t.Helper()
		g, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if len(g.Kvs) == 0 {
			return 0
		}
		return g.Kvs[0].Version
	}
	record := func(n int, failed bool) {
		t.Helper()
		for range n {
			if err := b.Record(ctx, "t", failed); err != nil {
				t.Fatal(err)
			}
		}
	}
	record(1, false) // the first call flushes: the window starts
	record(3, false) // within the same second: counted here only
	if w := writes(); w != 1 {
		t.Fatalf("%d writes for 4 successes within one flush interval, want 1", w)
	}
	clock.Add(time.Second)
	record(1, true) // flushes 4 calls, 1 failed: 5 in the window, 1 failed
	record(4, true) // counted here; each failure writes its consecutive count
	if st := b.State(); st.State != flow.Closed || st.Calls != 5 || st.Fails != 1 || st.Consecutive != 5 {
		t.Fatalf("before the second flush: %+v", st)
	}
	clock.Add(time.Second)
	record(1, true) // flushes 5 failures: 10 in the window, 6 failed
	if st := b.State(); st.State != flow.Open || st.Opened != 1 {
		t.Fatalf("at a ratio of 0.6 over 10 calls: %+v", st)
	}
}
