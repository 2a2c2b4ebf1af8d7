package paxoslock_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/paxostest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/paxoslock"
	"github.com/droverhq/drover/paxos/client"
)

// paxosGroupSize is the number of nodes of the groups the tests start.
const paxosGroupSize = 3

// newPaxosLocker makes a locker on g, closed when the test ends.
func newPaxosLocker(t testing.TB, g *paxostest.Group, ns string, ttl time.Duration, id string) *paxoslock.Locker {
	t.Helper()
	l, err := paxoslock.New(paxoslock.Config{Endpoints: g.Endpoints, Namespace: ns, TTL: ttl, HolderID: id})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// TestPaxosStatusShowsHolder checks that Status and List show the holder
// record (host, pid, since when) and the token, by namespace.
func TestPaxosStatusShowsHolder(t *testing.T) {
	t.Parallel()
	g := paxostest.Start(t, paxosGroupSize)
	ns := etcdtest.Namespace(t)
	lk := newPaxosLocker(t, g, ns, 5*time.Second, "worker-1")
	ctx := context.Background()
	before := time.Now()
	l, err := lk.Acquire(ctx, "report")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)
	st, err := lk.Status(ctx, "report")
	host, _ := os.Hostname()
	if err != nil || !st.Held || st.Token != l.Token() || st.Holder.ID != "worker-1" || st.Holder.Host != host || st.Holder.PID != os.Getpid() {
		t.Fatalf("status: %+v, %v", st, err)
	}
	if at := st.Holder.AcquiredAt; at.Before(before.Add(-time.Second)) || at.After(time.Now().Add(time.Second)) {
		t.Fatalf("acquired at %s, want about %s", at, before)
	}
	if st.TTL <= 0 || st.TTL > 5*time.Second {
		t.Fatalf("ttl left %s", st.TTL)
	}
	if l.Holder().AcquiredAt != st.Holder.AcquiredAt {
		t.Fatalf("the lock's holder %+v differs from its status %+v", l.Holder(), st.Holder)
	}
	list, err := lk.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "report" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	other, err := newPaxosLocker(t, g, etcdtest.Namespace(t), 5*time.Second, "x").List(ctx)
	if err != nil || len(other) != 0 {
		t.Fatalf("another namespace lists %+v, %v", other, err)
	}
	if st, err := lk.Status(ctx, "free"); err != nil || st.Held {
		t.Fatalf("free lock: %+v, %v", st, err)
	}
}

// TestPaxosLockerOwnersDiffer checks two lockers with the same holder id
// are different owners: neither releases the other's lock, and a second
// acquire through the same locker is refused.
func TestPaxosLockerOwnersDiffer(t *testing.T) {
	t.Parallel()
	g := paxostest.Start(t, paxosGroupSize)
	ns := etcdtest.Namespace(t)
	a, b := newPaxosLocker(t, g, ns, 5*time.Second, "same"), newPaxosLocker(t, g, ns, 5*time.Second, "same")
	ctx := context.Background()
	l, err := a.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Release(ctx, "k", l.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release by another locker with the same holder id: %v", err)
	}
	var held *lock.HeldError
	if _, err := a.TryAcquire(ctx, "k"); !errors.As(err, &held) || held.Token != l.Token() || held.Holder.ID != "same" {
		t.Fatalf("second acquire through the holder's own locker: %v", err)
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPaxosLostWhenRenewalRefused checks that the lock's context ends with
// a *LostError once the service refuses a renewal (here: the lock was
// released behind the holder's back).
func TestPaxosLostWhenRenewalRefused(t *testing.T) {
	t.Parallel()
	g := paxostest.Start(t, paxosGroupSize)
	ns := etcdtest.Namespace(t)
	lk := newPaxosLocker(t, g, ns, time.Second, "victim")
	l, err := lk.Acquire(context.Background(), "taken")
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.New(client.Config{Endpoints: g.Endpoints})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Close(context.Background()) }()
	// The locker keeps names of namespace NS as NS:NAME in the group.
	if err := c.Release(context.Background(), ns+":taken", lk.Owner(), uint64(l.Token())); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("lock context still live 2s after its lock was released behind its back (TTL 1s)")
	}
	var lost *lock.LostError
	if cause := context.Cause(l.Context()); !errors.As(cause, &lost) || !errors.Is(cause, lock.ErrLost) || lost.Token != l.Token() {
		t.Fatalf("cause %v, want a *LostError", cause)
	}
	if err := l.Release(context.Background()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release of a lost lock: %v", err)
	}
}

// TestPaxosLostWhenGroupUnreachable checks that the lock's context ends
// within the TTL once no node answers renewals.
func TestPaxosLostWhenGroupUnreachable(t *testing.T) {
	g := paxostest.Start(t, paxosGroupSize)
	lk := newPaxosLocker(t, g, "", time.Second, "cut-off")
	l, err := lk.Acquire(context.Background(), "cut")
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	g.Stop()
	select {
	case <-l.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("lock context still live 3s after the group stopped (TTL 1s)")
	}
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("lost after %s, want within the 1s TTL (plus a renewal's timeout)", d)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("cause %v", cause)
	}
}

// TestNewPaxosRefusesBadConfig checks the config errors.
func TestNewPaxosRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for _, cfg := range []paxoslock.Config{
		{},
		{Endpoints: []string{"no-port"}},
		{Endpoints: []string{"127.0.0.1:1"}, TTL: time.Millisecond},
		{Endpoints: []string{"127.0.0.1:1"}, Namespace: "a b"},
	} {
		if _, err := paxoslock.New(cfg); err == nil {
			t.Errorf("NewPaxos(%+v) took it", cfg)
		}
	}
}
