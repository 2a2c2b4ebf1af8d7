package paxoslock_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/paxostest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/internal/proctest"
	"github.com/droverhq/drover/lock/locktest"
	"github.com/droverhq/drover/lock/paxoslock"
	"github.com/droverhq/drover/paxos/client"
)

// TestConformance runs the lock.Locker suite, and its cross-process part,
// against a group of three nodes, with a TTL of 1 s.
func TestConformance(t *testing.T) {
	t.Parallel()
	const ttl = time.Second
	g := paxostest.Start(t, paxosGroupSize)
	newLocker := func(t *testing.T, ns, id string) lock.Locker { return newPaxosLocker(t, g, ns, ttl, id) }
	locktest.Exercise(context.Background(), t, newLocker, locktest.Options{TTL: ttl,
		// Released behind the holder's back: its next renewal is refused.
		Expire: func(ctx context.Context, t *testing.T, ns string, lk lock.Locker, l lock.Lock) {
			c, err := client.New(client.Config{Endpoints: g.Endpoints})
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = c.Close(ctx) }()
			if err := c.Release(ctx, ns+":"+l.Name(), lk.(*paxoslock.Locker).Owner(), uint64(l.Token())); err != nil {
				t.Fatal(err)
			}
		}})
	t.Run("processes", func(t *testing.T) {
		t.Parallel()
		proctest.Exercise(t, proctest.Backend{NewLocker: newLocker, Hold: "paxos-hold", Counter: "paxos-counter",
			Env: []string{"H_PAXOS=" + strings.Join(g.Endpoints, ",")}})
	})
}
