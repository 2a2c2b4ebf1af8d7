package budget_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// TestBatchEachCallItsOwnAnswer: reserves and settles decided as one batch
// get each their own answer (an unknown reservation, an estimate above the
// budget and a settle above its bound fail alone) while the others are
// written, together, in one transaction.
func TestBatchEachCallItsOwnAnswer(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	kv := &countKV{KV: cli.KV}
	cli.KV = kv
	b := budget.New(cli, ns, budget.WithClock(newFakeClock().Now))
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 10_000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	held, err := b.Reserve(ctx, key, "acme", 500)
	if err != nil {
		t.Fatal(err)
	}
	kv.n.Store(0)
	res, sets, errs, err := b.RunTogether(ctx, key, []budget.TestCall{
		{Tenant: "acme", Estimate: 100},
		{SettleID: "nosuchreservation", Actual: 10},
		{Tenant: "acme", Estimate: 20_000},
		{SettleID: held.ID, Actual: 20_000},
		{SettleID: held.ID, Actual: 400},
		{SettleID: held.ID, Actual: 400},
		{Tenant: "beta", Estimate: 200},
	})
	if err != nil {
		t.Fatal(err)
	}
	var in *drover.InputError
	for i, want := range []string{"ok", "409", "input", "input", "ok", "409", "ok"} {
		got := "ok"
		switch {
		case errors.Is(errs[i], budget.ErrNotReserved):
			got = "409"
		case errors.As(errs[i], &in):
			got = "input"
		case errs[i] != nil:
			got = errs[i].Error()
		}
		if got != want {
			t.Errorf("call %d: got %s (%v), want %s", i, got, errs[i], want)
		}
	}
	if res[0].ID == "" || res[6].ID == "" || sets[4].Difference != -100 {
		t.Errorf("answers: %+v %+v %+v", res[0], res[6], sets[4])
	}
	// A read (the cached view met an unknown reservation) and one write.
	if n := kv.n.Load(); n != 2 {
		t.Errorf("%d transactions, want 2", n)
	}
	u, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if u.RequestsUsed != 3 || u.Used != 400 || u.Reserved != 300 || u.Live != 2 {
		t.Errorf("usage %+v, want 3 requests, 400 used, 300 reserved, 2 live", u)
	}
}

// TestBatchConcurrentClients: three clients, sixteen goroutines each,
// reserve and settle one budget of 100 requests at once, with a settle of
// an unknown reservation among them: exactly 100 are admitted and the rest
// deferred, every admitted one settles, every bad settle alone is refused,
// and the budget's totals are exactly the sums of the outcomes.
func TestBatchConcurrentClients(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	const clients, goroutines, each, limit = 3, 16, 4, 100
	bs := make([]*budget.Client, clients)
	for i := range bs {
		bs[i] = budget.New(srv.Client(t), ns, budget.WithClock(newFakeClock().Now))
		defer bs[i].Close()
	}
	if _, err := bs[0].Set(ctx, budget.Budget{Key: key, Requests: limit, Tokens: 100_000_000, WindowSeconds: 86400}); err != nil {
		t.Fatal(err)
	}
	var admitted, deferred, settled, refused409, used, other atomic.Int64
	var wg sync.WaitGroup
	for i := range clients * goroutines {
		b := bs[i%clients]
		wg.Go(func() {
			for j := range each {
				r, err := b.Reserve(ctx, key, fmt.Sprintf("t%d", i%5), 100)
				var d *drover.DeferError
				switch {
				case errors.As(err, &d):
					deferred.Add(1)
				case err != nil:
					other.Add(1)
					t.Error(err)
				default:
					admitted.Add(1)
					actual := int64(50 + i + j)
					if _, err := b.Settle(ctx, r, actual, nil); err != nil {
						other.Add(1)
						t.Error(err)
					} else {
						settled.Add(1)
						used.Add(actual)
					}
				}
				bad := budget.Reservation{ID: fmt.Sprintf("unknown%d", i), Budget: key}
				if _, err := b.Settle(ctx, bad, 10, nil); errors.Is(err, budget.ErrNotReserved) {
					refused409.Add(1)
				} else {
					other.Add(1)
					t.Errorf("settle of an unknown reservation: %v", err)
				}
			}
		})
	}
	wg.Wait()
	total := int64(clients * goroutines * each)
	if admitted.Load() != limit || deferred.Load() != total-limit || settled.Load() != limit || refused409.Load() != total || other.Load() != 0 {
		t.Fatalf("admitted %d deferred %d settled %d 409 %d other %d", admitted.Load(), deferred.Load(), settled.Load(), refused409.Load(), other.Load())
	}
	u, err := bs[1].Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if u.RequestsUsed != limit || u.Used != used.Load() || u.Reserved != 0 || u.Live != 0 {
		t.Errorf("usage %+v, want %d requests, %d used, nothing held", u, limit, used.Load())
	}
}

// TestBatchDecidedAgainAfterConflict: a batch decided on this client's
// cached view, after another client wrote the budget, fails its compare
// and is decided again on the budget as it is now: the first attempt's
// decisions (a settle's charge, reserves' requests) are not counted twice
// and nothing is lost.
func TestBatchDecidedAgainAfterConflict(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	kv := &countKV{KV: cli.KV}
	cli.KV = kv
	clock := newFakeClock()
	a := budget.New(cli, ns, budget.WithClock(clock.Now))
	defer a.Close()
	other := budget.New(srv.Client(t), ns, budget.WithClock(clock.Now))
	defer other.Close()
	if _, err := a.Set(ctx, budget.Budget{Key: key, Tokens: 10_000, Requests: 10, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	held, err := a.Reserve(ctx, key, "acme", 500) // a's cache now holds the budget
	if err != nil {
		t.Fatal(err)
	}
	if _, err := other.Reserve(ctx, key, "beta", 1000); err != nil { // a's cache is now out of date
		t.Fatal(err)
	}
	kv.n.Store(0)
	_, sets, errs, err := a.RunTogether(ctx, key, []budget.TestCall{
		{Tenant: "acme", Estimate: 100},
		{SettleID: held.ID, Actual: 400},
		{Tenant: "acme", Estimate: 200},
		{Tenant: "beta", Estimate: 300},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if sets[1].Actual != 400 || sets[1].Difference != -100 {
		t.Errorf("settlement %+v", sets[1])
	}
	// The write on the cached view fails its compare and brings the
	// budget as it is now (no read of its own); the second write succeeds.
	if n := kv.n.Load(); n != 2 {
		t.Errorf("%d transactions, want 2", n)
	}
	u, err := a.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if u.RequestsUsed != 5 || u.Used != 400 || u.Reserved != 1600 || u.Live != 4 {
		t.Errorf("usage %+v, want 5 requests, 400 used, 1600 reserved, 4 live", u)
	}
}

// TestBatchReserveOnEndedLease: etcd refuses a whole transaction that puts
// a key under an ended lease; the reserve under it fails alone, and the
// others of its batch are written without it, each counted once.
func TestBatchReserveOnEndedLease(t *testing.T) {
	ctx := context.Background()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	b := budget.New(cli, ns, budget.WithClock(newFakeClock().Now))
	defer b.Close()
	if _, err := b.Set(ctx, budget.Budget{Key: key, Tokens: 10_000, WindowSeconds: 60}); err != nil {
		t.Fatal(err)
	}
	g, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Revoke(ctx, g.ID); err != nil {
		t.Fatal(err)
	}
	_, _, errs, err := b.RunTogether(ctx, key, []budget.TestCall{
		{Tenant: "acme", Estimate: 100},
		{Tenant: "acme", Estimate: 200, Lease: g.ID},
		{Tenant: "beta", Estimate: 300},
	})
	if err != nil {
		t.Fatal(err)
	}
	if errs[0] != nil || errs[2] != nil || !errors.Is(errs[1], rpctypes.ErrLeaseNotFound) {
		t.Fatalf("answers %v, want the ended lease's reserve alone to fail", errs)
	}
	u, err := b.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if u.RequestsUsed != 2 || u.Reserved != 400 || u.Live != 2 {
		t.Errorf("usage %+v, want 2 requests, 400 reserved, 2 live", u)
	}
}
