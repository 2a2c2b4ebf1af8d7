package storeguard_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/storeguard"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// t0 is when the tests' clocks start.
var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// clock is a test's clock: set moves it.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }

func (c *clock) set(t time.Time) { c.mu.Lock(); defer c.mu.Unlock(); c.now = t }

// newAdmission is an Admission on a clock of its own, at t0.
func newAdmission() (*storeguard.Admission, *clock) {
	c := &clock{now: t0}
	return storeguard.NewAdmission(c.Now), c
}

// measure refreshes a as a guard of member does: a measurement begun at
// at found size bytes of a quota of 1,000,000 (high-water mark 70 %).
func measure(a *storeguard.Admission, c *clock, member string, at time.Time, size int64, full bool) {
	c.set(at)
	m := a.Mark()
	a.Refresh(member, m, size, 1_000_000, 0.7, 0.6, full)
}

// TestAdmissionReservesAgainstHeadroom: before any measurement every write
// is admitted; after one, writes fit the headroom (700,000 − size) less
// what was reserved since (Fits says so without reserving), then are
// refused with a StoreFullError that says the quota and marks; a write that did not take place gives its
// bytes back; a full store admits nothing.
func TestAdmissionReservesAgainstHeadroom(t *testing.T) {
	a, c := newAdmission()
	r, err := a.Reserve(5_000_000)
	if err != nil {
		t.Fatalf("reservation before any measurement: %v", err)
	}
	r.Done(false)
	measure(a, c, "m1", t0, 600_000, false) // 100,000 of headroom
	var rs []*storeguard.Reservation
	for i := 0; i < 4; i++ {
		r, err := a.Reserve(25_000)
		if err != nil {
			t.Fatalf("reservation %d of 25,000 in 100,000 of headroom: %v", i, err)
		}
		rs = append(rs, r)
	}
	if usage, fits := a.Fits(1); fits || usage != 700_001 {
		t.Fatalf("Fits(1) with no headroom left: %d, %v; want 700001, false", usage, fits)
	}
	_, err = a.Reserve(1)
	var sf *drover.StoreFullError
	if !errors.As(err, &sf) || !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("reservation past the headroom: %v, want a StoreFullError", err)
	}
	if sf.Quota != 1_000_000 || sf.HighWater != 0.7 || sf.LowWater != 0.6 || sf.Usage != 700_001 {
		t.Fatalf("refusal %+v, want usage 700001 of 1000000 at 70/60 %%", sf)
	}
	rs[0].Done(false) // not written: its 25,000 are free again
	rs[0].Done(true)  // a second Done does nothing
	if _, err := a.Reserve(25_000); err != nil {
		t.Fatalf("reservation in bytes given back: %v", err)
	}
	if st := a.Stats(); st.Admitted != 6 || st.Refused != 1 || st.Reserved != 100_000 {
		t.Fatalf("stats %+v, want 6 admitted, 1 refused, 100000 reserved", st)
	}
	if _, fits := a.Fits(0); !fits {
		t.Fatal("Fits(0) with no headroom left: false")
	}
	measure(a, c, "m1", t0.Add(10*time.Second), 100_000, true)
	if _, err := a.Reserve(1); err == nil {
		t.Fatal("a full store admitted a write")
	}
	if _, err := a.Reserve(0); err != nil {
		t.Fatalf("a write that adds nothing on a full store: %v", err)
	}
	a.Forget("m1")
	if _, err := a.Reserve(1 << 30); err != nil {
		t.Fatalf("reservation with no member measured: %v", err)
	}
}

// TestAdmissionConcurrentReservations: 16 writers reserving 1,000 bytes at
// once against 100,000 of headroom: exactly 100 are admitted, however they
// interleave, and the others refused.
func TestAdmissionConcurrentReservations(t *testing.T) {
	a, c := newAdmission()
	measure(a, c, "m1", t0, 600_000, false)
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < 16; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 50; i++ {
				r, err := a.Reserve(1000)
				if err != nil {
					refused.Add(1)
					continue
				}
				admitted.Add(1)
				r.Done(true)
			}
		}()
	}
	wg.Wait()
	if admitted.Load() != 100 || refused.Load() != 700 {
		t.Fatalf("%d admitted, %d refused; want 100 and 700", admitted.Load(), refused.Load())
	}
}

// TestAdmissionSettles: a write finished just before a measurement may not
// be in the size etcd reports yet (etcd commits to its file in batches):
// it stays counted until a measurement begun Settle after it; one still in
// flight stays counted too; the measurement that counts them frees them.
func TestAdmissionSettles(t *testing.T) {
	a, c := newAdmission()
	measure(a, c, "m1", t0, 600_000, false) // 100,000 of headroom
	r, err := a.Reserve(60_000)
	if err != nil {
		t.Fatal(err)
	}
	c.set(t0.Add(storeguard.Settle / 2))
	r.Done(true) // finished at Settle/2
	inflight, err := a.Reserve(20_000)
	if err != nil {
		t.Fatal(err)
	}
	// Measured just after: the 60,000 may not be in the size yet.
	measure(a, c, "m1", t0.Add(storeguard.Settle), 660_000, false)
	if _, err := a.Reserve(40_000); err == nil {
		t.Fatal("admitted 40,000 with 60,000 and 20,000 reserved against 40,000 of headroom")
	}
	inflight.Done(true) // finished at Settle
	// Measured Settle after the first finished: it is in the size; the
	// 20,000 finished since are still counted.
	measure(a, c, "m1", t0.Add(storeguard.Settle*3/2), 660_000, false)
	if _, err := a.Reserve(20_001); err == nil {
		t.Fatal("admitted 20,001 with 20,000 reserved against 40,000 of headroom")
	}
	measure(a, c, "m1", t0.Add(storeguard.Settle*3), 680_000, false)
	if _, err := a.Reserve(20_000); err != nil {
		t.Fatalf("20,000 in 20,000 of headroom: %v", err)
	}
}

// TestAdmissionMembers: a write must fit every member's headroom.
func TestAdmissionMembers(t *testing.T) {
	a, c := newAdmission()
	measure(a, c, "m1", t0, 100_000, false)
	measure(a, c, "m2", t0, 690_000, false)
	if _, err := a.Reserve(10_001); err == nil {
		t.Fatal("admitted past the fuller member's headroom")
	}
	a.Forget("m2")
	if _, err := a.Reserve(10_001); err != nil {
		t.Fatalf("with the fuller member forgotten: %v", err)
	}
}

// TestAdmissionKicks: a reservation past half a member's headroom kicks
// every guard's channel once per measurement; a refusal kicks too.
func TestAdmissionKicks(t *testing.T) {
	a, c := newAdmission()
	k1, k2 := a.Kicks(), a.Kicks()
	kicked := func(c <-chan struct{}) bool {
		select {
		case <-c:
			return true
		default:
			return false
		}
	}
	measure(a, c, "m1", t0, 600_000, false)
	if _, err := a.Reserve(50_000); err != nil || kicked(k1) || kicked(k2) {
		t.Fatalf("half the headroom: %v, or kicked", err)
	}
	if _, err := a.Reserve(1); err != nil || !kicked(k1) || !kicked(k2) {
		t.Fatalf("past half the headroom: %v, or not kicked", err)
	}
	if _, err := a.Reserve(1); err != nil || kicked(k1) {
		t.Fatalf("past half again: %v, or kicked twice", err)
	}
	if _, err := a.Reserve(50_000); err == nil || !kicked(k1) {
		t.Fatalf("past the headroom: %v, or not kicked", err)
	}
}

// TestNewKV: through a client whose KV admits, a transaction with the
// guard's compare reserves its puts' cost and is refused, unsent, past the
// headroom; the bytes of one that was sent but failed its compares are
// given back; transactions without the compare (control plane) and plain
// puts are not counted.
func TestNewKV(t *testing.T) {
	t.Parallel()
	raw := srv.Client(t)
	cli := srv.Client(t)
	a, c := newAdmission()
	cli.KV = storeguard.NewKV(cli.KV, a)
	ctx := context.Background()
	keys := keyspace.MustNew(etcdtest.Namespace(t))
	value := strings.Repeat("v", 10_000)
	write := func(key string) error {
		_, err := cli.Txn(ctx).If(storeguard.NotFull(keys)).Then(clientv3.OpPut(key, value)).Else(storeguard.GetOp(keys)).Commit()
		return err
	}
	cost := storeguard.Cost(clientv3.OpPut(keys.Root()+"d/0", value))
	if cost < 10_000 || cost%4096 != 0 {
		t.Fatalf("cost of a 10 KB put: %d, want whole pages past 10,000", cost)
	}
	measure(a, c, "m1", t0, 700_000-3*cost, false)
	for i := 0; i < 3; i++ {
		if err := write(keys.Root() + "d/" + string(rune('a'+i))); err != nil {
			t.Fatalf("write %d within the headroom: %v", i, err)
		}
	}
	if err := write(keys.Root() + "d/z"); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("write past the headroom: %v, want ErrStoreFull", err)
	}
	if g, err := raw.Get(ctx, keys.Root()+"d/z"); err != nil || len(g.Kvs) != 0 {
		t.Fatalf("the refused write reached etcd: %v, %v", g, err)
	}
	if _, err := cli.Put(ctx, keys.Root()+"control", value); err != nil {
		t.Fatalf("plain put: %v", err)
	}
	if _, err := cli.Txn(ctx).Then(clientv3.OpPut(keys.Root()+"control2", value)).Commit(); err != nil {
		t.Fatalf("transaction without the guard's compare: %v", err)
	}
	if st := a.Stats(); st.Admitted != 3 || st.Refused != 1 || st.Reserved != 3*cost {
		t.Fatalf("stats %+v, want 3 admitted, 1 refused, %d reserved", st, 3*cost)
	}
	// A compare that fails: nothing written, the reservation given back.
	measure(a, c, "m1", t0.Add(time.Hour), 0, false)
	before := a.Stats().Reserved
	r, err := cli.Txn(ctx).If(storeguard.NotFull(keys), clientv3.Compare(clientv3.Version(keys.Root()+"d/a"), "=", 0)).
		Then(clientv3.OpPut(keys.Root()+"d/y", value)).Commit()
	if err != nil || r.Succeeded || a.Stats().Reserved != before {
		t.Fatalf("failed compare: %v, %v; reserved %d, want %d", r, err, a.Stats().Reserved, before)
	}
}

// TestAdmissionManyCompletions: more completions than an Admission keeps
// (4,096) within one Settle, the first of 500,000 bytes: a measurement
// begun before any settled has not seen the 500,000, so a write of
// 200,001 does not fit 700,000 of headroom; once they settle it does.
// The oldest completions used to be dropped, and the 500,000 counted as
// measured.
func TestAdmissionManyCompletions(t *testing.T) {
	a, c := newAdmission()
	measure(a, c, "m1", t0, 0, false) // 700,000 of headroom
	r, err := a.Reserve(500_000)
	if err != nil {
		t.Fatal(err)
	}
	c.set(t0.Add(time.Millisecond))
	r.Done(true)
	c.set(t0.Add(2 * time.Millisecond))
	for i := 0; i < 5000; i++ {
		r, err := a.Reserve(0)
		if err != nil {
			t.Fatal(err)
		}
		r.Done(true)
	}
	measure(a, c, "m1", t0.Add(storeguard.Settle/2), 0, false)
	if _, err := a.Reserve(200_001); err == nil {
		t.Fatal("admitted 200,001 with 500,000 not yet measured against 700,000 of headroom")
	}
	measure(a, c, "m1", t0.Add(storeguard.Settle+2*time.Millisecond), 500_000, false)
	if _, err := a.Reserve(200_000); err != nil {
		t.Fatalf("200,000 in 200,000 of headroom once measured: %v", err)
	}
}

// TestAdmissionMembersMeasureApart: two members share an Admission, with
// measurements that overlap: m2's begins before a write of 500,000 has
// settled, m1's after, and m1's is refreshed first. m2's did not see the
// write: a write of 200,001 does not fit m2's 700,000 of headroom until m2
// is measured again. m1's refresh used to make m2's count it as measured.
func TestAdmissionMembersMeasureApart(t *testing.T) {
	a, c := newAdmission()
	measure(a, c, "m1", t0, 0, false)
	measure(a, c, "m2", t0, 0, false)
	r, err := a.Reserve(500_000)
	if err != nil {
		t.Fatal(err)
	}
	c.set(t0.Add(time.Millisecond))
	r.Done(true)
	c.set(t0.Add(storeguard.Settle / 2))
	m2 := a.Mark()
	c.set(t0.Add(2 * storeguard.Settle))
	m1 := a.Mark()
	a.Refresh("m1", m1, 500_000, 2_000_000, 0.7, 0.6, false) // 900,000 of headroom
	a.Refresh("m2", m2, 0, 1_000_000, 0.7, 0.6, false)       // 700,000, not counting the write
	if _, err := a.Reserve(200_001); err == nil {
		t.Fatal("admitted 200,001 with 500,000 that m2's measurement did not see against its 700,000 of headroom")
	}
	measure(a, c, "m2", t0.Add(3*storeguard.Settle), 500_000, false)
	if _, err := a.Reserve(200_000); err != nil {
		t.Fatalf("200,000 in m2's 200,000 of headroom once measured: %v", err)
	}
}

// TestAdmissionZeroCostPastTheMark: a write that adds nothing is admitted
// (and fits) even with the store measured past its high-water mark, where
// the headroom is negative; one byte is refused.
func TestAdmissionZeroCostPastTheMark(t *testing.T) {
	a, c := newAdmission()
	measure(a, c, "m1", t0, 800_000, false) // 100,000 past the mark
	if _, err := a.Reserve(0); err != nil {
		t.Fatalf("a write that adds nothing past the mark: %v", err)
	}
	if _, fits := a.Fits(0); !fits {
		t.Fatal("Fits(0) past the mark: false")
	}
	if _, err := a.Reserve(1); !errors.Is(err, drover.ErrStoreFull) {
		t.Fatalf("one byte past the mark: %v, want ErrStoreFull", err)
	}
}
