package locktest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/lock"
)

// NewLocker makes a locker of the backend under test for namespace ns,
// with a holder identity of its own named id, using the TTL given in
// Options. The locker must be closed when t ends (t.Cleanup).
type NewLocker func(t *testing.T, ns, id string) lock.Locker

// Options tunes the suite to a backend.
type Options struct {
	// TTL is the TTL of the lockers NewLocker makes; zero means
	// lock.DefaultTTL. RenewalKeepsIt holds a lock for ten of them.
	TTL time.Duration
	// Expire ends l's holding at once behind its holder's back, as a
	// holder cut off past its TTL would see it: for example by deleting
	// its key or revoking its lease. lk is the locker of namespace ns
	// that holds l. Nil skips ExpiryLosesLock.
	Expire func(ctx context.Context, t *testing.T, ns string, lk lock.Locker, l lock.Lock)
	// HeldTokenIsOneServers says that a *HeldError's token is the one a
	// single server of the backend recorded, which may differ from the
	// holder's lock token (Redlock: each server counts its own tokens and
	// the lock takes the highest of a majority). The suite then checks
	// the holder's identity only.
	HeldTokenIsOneServers bool
}

// nsSeq numbers the namespaces of one test process.
var nsSeq atomic.Int64

// namespace returns a namespace of the test's own.
func namespace() string { return fmt.Sprintf("locktest-%d-%d", os.Getpid(), nsSeq.Add(1)) }

// Exercise runs the suite against the backend newLocker makes lockers of.
// Its subtests run in parallel, each in a namespace of its own.
func Exercise(ctx context.Context, t *testing.T, newLocker NewLocker, opts Options) {
	t.Helper()
	if opts.TTL == 0 {
		opts.TTL = lock.DefaultTTL
	}
	s := suite{ctx: ctx, newLocker: newLocker, opts: opts}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T)
	}{
		{"MutualExclusion", s.mutualExclusion},
		{"TokensIncrease", s.tokensIncrease},
		{"ReleaseFenced", s.releaseFenced},
		{"HeldAndWaitBound", s.heldAndWaitBound},
		{"StatusAndList", s.statusAndList},
		{"RenewalKeepsIt", s.renewalKeepsIt},
		{"ExpiryLosesLock", s.expiryLosesLock},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tc.run(t)
		})
	}
}

// suite is one run of Exercise.
type suite struct {
	ctx       context.Context
	newLocker NewLocker
	opts      Options
}

// mutualExclusion: four lockers take one lock eight times each and run a
// read-modify-write of a shared counter under it; no two are ever inside
// at once and no increment is lost.
func (s suite) mutualExclusion(t *testing.T) {
	const holders, rounds = 4, 8
	ns := namespace()
	var (
		in, peak atomic.Int64
		counter  int
		wg       sync.WaitGroup
	)
	for g := range holders {
		lk := s.newLocker(t, ns, fmt.Sprintf("g%d", g))
		wg.Go(func() {
			for range rounds {
				l, err := lk.Acquire(s.ctx, "counter")
				if err != nil {
					t.Error(err)
					return
				}
				for n := in.Add(1); ; { // peak = max(peak, n), atomically
					p := peak.Load()
					if n <= p || peak.CompareAndSwap(p, n) {
						break
					}
				}
				n := counter
				time.Sleep(500 * time.Microsecond)
				counter = n + 1
				in.Add(-1)
				if err := l.Release(s.ctx); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if counter != holders*rounds || peak.Load() != 1 {
		t.Fatalf("counter %d, want %d; %d holders at once, want 1", counter, holders*rounds, peak.Load())
	}
}

// tokensIncrease: each new holding's token is above the one before, the
// holders alternating; a second release of a holding is refused.
func (s suite) tokensIncrease(t *testing.T) {
	ns := namespace()
	x, y := s.newLocker(t, ns, "x"), s.newLocker(t, ns, "y")
	var last int64
	for i := range 10 {
		l, err := []lock.Locker{x, y}[i%2].Acquire(s.ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("holding %d: token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(s.ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Release(s.ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Fatalf("second release: %v, want ErrNotHeld", err)
		}
	}
}

// releaseFenced: neither another locker that knows the token nor the
// holder with a wrong token releases a lock, and a release retried with
// a stale token leaves the next holder alone; the holding locker releases
// by token, which ends the lock's context.
func (s suite) releaseFenced(t *testing.T) {
	ns := namespace()
	a, b := s.newLocker(t, ns, "a"), s.newLocker(t, ns, "b")
	la, err := a.Acquire(s.ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	var nh *lock.NotHeldError
	if err := b.Release(s.ctx, "r", la.Token()); !errors.As(err, &nh) {
		t.Fatalf("release by another locker with the right token: %v, want a *NotHeldError", err)
	}
	if err := a.Release(s.ctx, "r", la.Token()+1); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release with a wrong token: %v, want ErrNotHeld", err)
	}
	if st, err := b.Status(s.ctx, "r"); err != nil || !st.Held || st.Token != la.Token() {
		t.Fatalf("after refused releases the lock is %+v (%v), want held with token %d", st, err, la.Token())
	}
	if err := la.Release(s.ctx); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(la.Context()); !errors.Is(cause, lock.ErrReleased) {
		t.Fatalf("cause after release: %v, want ErrReleased", cause)
	}
	lb, err := b.Acquire(s.ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Release(s.ctx, "r", la.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("stale-token release: %v, want ErrNotHeld", err)
	}
	if st, err := a.Status(s.ctx, "r"); err != nil || !st.Held || st.Token != lb.Token() {
		t.Fatalf("after a stale release the lock is %+v (%v), want held with token %d", st, err, lb.Token())
	}
	if err := b.Release(s.ctx, "r", lb.Token()); err != nil {
		t.Fatalf("release by token from the holding locker: %v", err)
	}
	if st, err := a.Status(s.ctx, "r"); err != nil || st.Held {
		t.Fatalf("after release by token the lock is %+v (%v), want free", st, err)
	}
}

// heldAndWaitBound: a try on a held lock says who holds it; a wait bounded
// by a context gives up with an error matching both ErrHeld and the
// context's error.
func (s suite) heldAndWaitBound(t *testing.T) {
	ns := namespace()
	a, b := s.newLocker(t, ns, "worker-a"), s.newLocker(t, ns, "worker-b")
	la, err := a.TryAcquire(s.ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = la.Release(s.ctx) }()
	var held *lock.HeldError
	_, err = b.TryAcquire(s.ctx, "job")
	if !errors.As(err, &held) || held.Holder.ID != "worker-a" || (!s.opts.HeldTokenIsOneServers && held.Token != la.Token()) {
		t.Fatalf("try-acquire of a held lock: %v, want a *HeldError naming worker-a and token %d", err, la.Token())
	}
	// The bound leaves room for the first try's answer on a loaded
	// machine: the error says the lock is held once a try has said so.
	wctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	if _, err := b.Acquire(wctx, "job"); !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("bounded wait: %v, want ErrHeld and DeadlineExceeded", err)
	}
}

// statusAndList: Status shows the holder's record, token and TTL left,
// and a free lock as free; List shows the namespace's held locks by name,
// and another namespace's none of them.
func (s suite) statusAndList(t *testing.T) {
	ns := namespace()
	a := s.newLocker(t, ns, "ops-a")
	l1, err := a.Acquire(s.ctx, "alpha")
	if err != nil {
		t.Fatal(err)
	}
	l2, err := a.Acquire(s.ctx, "beta")
	if err != nil {
		t.Fatal(err)
	}
	st, err := a.Status(s.ctx, "alpha")
	host, _ := os.Hostname()
	if err != nil || !st.Held || st.Token != l1.Token() || st.Holder.ID != "ops-a" || st.Holder.Host != host ||
		st.Holder.PID != os.Getpid() || st.Holder.AcquiredAt.IsZero() || st.TTL <= 0 || st.TTL > s.opts.TTL {
		t.Fatalf("status %+v (%v), want held by ops-a with token %d and a TTL in (0, %s]", st, err, l1.Token(), s.opts.TTL)
	}
	if free, err := a.Status(s.ctx, "gamma"); err != nil || free.Held {
		t.Fatalf("free lock status %+v (%v)", free, err)
	}
	list, err := a.List(s.ctx)
	if err != nil || len(list) != 2 || list[0].Name != "alpha" || list[1].Name != "beta" || list[0].Token != l1.Token() {
		t.Fatalf("list %+v (%v), want alpha and beta", list, err)
	}
	if other, err := s.newLocker(t, namespace(), "x").List(s.ctx); err != nil || len(other) != 0 {
		t.Fatalf("another namespace lists %+v (%v)", other, err)
	}
	for _, l := range []lock.Lock{l1, l2} {
		if err := l.Release(s.ctx); err != nil {
			t.Fatal(err)
		}
	}
	if list, err := a.List(s.ctx); err != nil || len(list) != 0 {
		t.Fatalf("after release the list is %+v (%v)", list, err)
	}
}

// renewalKeepsIt: a holding outlives ten TTLs, renewed, and nobody else
// gets in meanwhile.
func (s suite) renewalKeepsIt(t *testing.T) {
	ns := namespace()
	lk, other := s.newLocker(t, ns, "holder"), s.newLocker(t, ns, "other")
	l, err := lk.Acquire(s.ctx, "long")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * s.opts.TTL)
	for time.Now().Before(deadline) {
		if l.Context().Err() != nil {
			t.Fatalf("lost while renewed: %v", context.Cause(l.Context()))
		}
		if _, err := other.TryAcquire(s.ctx, "long"); !errors.Is(err, lock.ErrHeld) {
			t.Fatalf("another holder got in: %v", err)
		}
		time.Sleep(s.opts.TTL / 2)
	}
	if err := l.Release(s.ctx); err != nil {
		t.Fatal(err)
	}
}

// expiryLosesLock: a holding that ends behind its holder's back cancels
// the holder's context with ErrLost, its release is refused, and the next
// holder gets a higher token.
func (s suite) expiryLosesLock(t *testing.T) {
	if s.opts.Expire == nil {
		t.Skip("the backend has no way to expire a holding on purpose (Options.Expire)")
	}
	ns := namespace()
	lk := s.newLocker(t, ns, "victim")
	l, err := lk.Acquire(s.ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	s.opts.Expire(s.ctx, t, ns, lk, l)
	select {
	case <-l.Context().Done():
	case <-time.After(2*s.opts.TTL + 5*time.Second):
		t.Fatalf("lock context alive %s after its holding ended", 2*s.opts.TTL+5*time.Second)
	}
	var lost *lock.LostError
	if cause := context.Cause(l.Context()); !errors.As(cause, &lost) || !errors.Is(cause, lock.ErrLost) || lost.Token != l.Token() {
		t.Fatalf("cause %v, want a *LostError with token %d", cause, l.Token())
	}
	if err := l.Release(s.ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release of a lost lock: %v, want ErrNotHeld", err)
	}
	next, err := s.newLocker(t, ns, "successor").Acquire(s.ctx, "gone")
	if err != nil {
		t.Fatal(err)
	}
	if next.Token() <= l.Token() {
		t.Fatalf("successor's token %d not above %d", next.Token(), l.Token())
	}
	_ = next.Release(s.ctx)
}
