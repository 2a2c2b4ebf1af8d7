// Package fencetest is the conformance suite of lease.Fence: every right
// held under a lease (an etcd lock, a queue task's claim, a task runner's
// hold) must pass Exercise, against a real etcd.
//
//	func TestFenceConformance(t *testing.T) {
//		fencetest.Exercise(t, fencetest.Harness{Client: cli, Key: key, Claim: claim, Lose: lose})
//	}
package fencetest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/droverhq/drover/lease"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Harness is what Exercise needs of an implementation.
type Harness struct {
	// Client reads and writes Key.
	Client *clientv3.Client
	// Key is an etcd key the suite writes under fences, its own for the
	// run (the suite adds suffixes).
	Key string
	// Claim takes the right named id as a new holder with a lease of its
	// own, waiting while another holds it, and returns it with the
	// function that gives it up.
	Claim func(ctx context.Context, id string) (f lease.Fence, release func(), err error)
	// Lose takes f's right from its holder at once, as a crash past the
	// TTL would: for example by revoking its lease.
	Lose func(ctx context.Context, f lease.Fence) error
	// LossWithin bounds how soon f's context must end after Lose; zero
	// means 2 s.
	LossWithin time.Duration
}

// Exercise runs the suite: mutual exclusion, strictly increasing tokens, a
// stale write refused, and loss cancelling the holder's context.
func Exercise(t *testing.T, h Harness) {
	t.Helper()
	if h.LossWithin == 0 {
		h.LossWithin = 2 * time.Second
	}
	t.Run("MutualExclusion", func(t *testing.T) { mutualExclusion(t, h) })
	t.Run("IncreasingTokens", func(t *testing.T) { increasingTokens(t, h) })
	t.Run("StaleWriteRefused", func(t *testing.T) { staleWriteRefused(t, h) })
	t.Run("LossCancelsContext", func(t *testing.T) { lossCancels(t, h) })
}

func claim(t *testing.T, h Harness, id string) (lease.Fence, func()) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	f, release, err := h.Claim(ctx, id)
	if err != nil {
		t.Fatalf("claim %s: %v", id, err)
	}
	return f, release
}

// mutualExclusion: four holders take one right five times each; never two
// at once, and a counter each one increments with a fenced
// read-modify-write loses no update.
func mutualExclusion(t *testing.T, h Harness) {
	const holders, rounds = 4, 5
	key := h.Key + "/counter"
	var in, peak atomic.Int64
	var wg sync.WaitGroup
	for range holders {
		wg.Go(func() {
			for range rounds {
				f, release := claim(t, h, "mx")
				if n := in.Add(1); n > peak.Load() {
					peak.Store(n)
				}
				ctx := context.Background()
				g, err := h.Client.Get(ctx, key)
				if err != nil {
					t.Error(err)
				}
				n := 0
				if len(g.Kvs) == 1 {
					n, _ = strconv.Atoi(string(g.Kvs[0].Value))
				}
				time.Sleep(5 * time.Millisecond)
				if _, err := f.Txn(ctx).Then(clientv3.OpPut(key, strconv.Itoa(n+1))).Commit(); err != nil {
					t.Errorf("fenced write while held: %v", err)
				}
				in.Add(-1)
				release()
			}
		})
	}
	wg.Wait()
	g, err := h.Client.Get(context.Background(), key)
	if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != strconv.Itoa(holders*rounds) {
		t.Fatalf("counter %v (%v), want %d: an update was lost", g, err, holders*rounds)
	}
	if peak.Load() != 1 {
		t.Fatalf("%d holders at once", peak.Load())
	}
}

// increasingTokens: each new holder's token is above the one before.
func increasingTokens(t *testing.T, h Harness) {
	var last int64
	for i := range 5 {
		f, release := claim(t, h, "tokens")
		if f.Token() <= last {
			t.Fatalf("claim %d: token %d after %d", i, f.Token(), last)
		}
		last = f.Token()
		release()
	}
}

// staleWriteRefused: a holder that lost its right writes nothing, even
// after its successor wrote; its successor's write stands.
func staleWriteRefused(t *testing.T, h Harness) {
	ctx := context.Background()
	key := h.Key + "/stale"
	a, releaseA := claim(t, h, "stale")
	defer releaseA()
	if err := h.Lose(ctx, a); err != nil {
		t.Fatal(err)
	}
	b, releaseB := claim(t, h, "stale")
	defer releaseB()
	if b.Token() <= a.Token() {
		t.Fatalf("successor's token %d is not above %d", b.Token(), a.Token())
	}
	if _, err := b.Txn(ctx).Then(clientv3.OpPut(key, "successor")).Commit(); err != nil {
		t.Fatalf("successor's write: %v", err)
	}
	_, err := a.Txn(ctx).Then(clientv3.OpPut(key, "stale")).Commit()
	if !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("stale write: %v, want lease.ErrFenced", err)
	}
	if g, _ := h.Client.Get(ctx, key); len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "successor" {
		t.Fatalf("value %v, want the successor's", g.Kvs)
	}
	if a.Err() == nil {
		t.Fatal("a refused holder still reports its right held")
	}
}

// lossCancels: the holder's context ends within LossWithin of the loss.
func lossCancels(t *testing.T, h Harness) {
	f, release := claim(t, h, "loss")
	defer release()
	began := time.Now()
	if err := h.Lose(context.Background(), f); err != nil {
		t.Fatal(err)
	}
	select {
	case <-f.Context().Done():
	case <-time.After(h.LossWithin):
		t.Fatalf("context not cancelled %s after the loss", h.LossWithin)
	}
	if f.Err() == nil {
		t.Fatal("Err is nil after the loss")
	}
	t.Logf("context cancelled %s after the loss", time.Since(began).Round(time.Millisecond))
}
