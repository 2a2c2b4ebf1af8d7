package flow_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestLimiterFollowsRateChange: three limiters open a limit configured in
// etcd at 10/s with a default of 1000/s (etcd's setting wins) and take
// exactly 10 tokens per second of their clock; `limits set` raises it to
// 40/s and, once each limiter has seen the change, they take exactly 40
// per second. The clock is the test's: the counts are what the limiters
// decided, whatever the machine's load.
func TestLimiterFollowsRateChange(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	cli := srv.Client(t)
	slow := flow.Rate{Events: 10, Per: time.Second, Burst: 50}
	if err := flow.SetRate(ctx, cli, ns, "api", slow); err != nil {
		t.Fatal(err)
	}
	def, _ := flow.ParseRate("rate", "1000/s")
	clock := newFakeClock()
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	var granted atomic.Int64
	var wg sync.WaitGroup
	var lims []*flow.Limiter
	for range 3 {
		l := newLimiter(t, ns, "api", &def)
		flow.SetLimiterClock(l, clock.Now)
		if l.Rate() != slow {
			t.Fatalf("limiter opened with %s burst %d, want etcd's 10/s burst 50", l.Rate(), l.Rate().Burst)
		}
		lims = append(lims, l)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer l.Close(context.Background())
			for {
				res, err := l.Reserve(rctx, 1)
				if err != nil {
					if rctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				granted.Add(1)
				res.Settle(1)
			}
		}()
	}
	// expect waits (bounded only against a hang) until want tokens were
	// granted, then gives the limiters room to take more than they may.
	expect := func(want int64, when string) {
		t.Helper()
		waitUntil(t, func() bool { return granted.Load() >= want })
		time.Sleep(250 * time.Millisecond)
		if got := granted.Load(); got != want {
			t.Fatalf("%s: %d tokens granted, want %d", when, got, want)
		}
	}
	expect(50, "the burst, before the clock moves")
	clock.Add(time.Second)
	expect(60, "one second at 10/s")
	fast := flow.Rate{Events: 40, Per: time.Second, Burst: 50}
	if err := flow.SetRate(ctx, cli, ns, "api", fast); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, func() bool {
		for _, l := range lims {
			if l.Rate() != fast {
				return false
			}
		}
		return true
	})
	expect(60, "the change alone grants nothing")
	clock.Add(time.Second)
	expect(100, "one second at 40/s")
	clock.Add(time.Second)
	expect(140, "two seconds at 40/s")
	stop()
	wg.Wait()
}

// waitUntil polls cond until it holds; the bound only guards against a hang.
func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 60 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
