package checkpoint_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/storeguard"
)

// TestEtcdStoreYieldsWhileStoreFull: while the namespace's store-full guard
// key exists, Put and PutWrites of the etcd store (unfenced, fenced by a
// token whether or not the thread's fence key exists yet, fenced by an etcd
// lock) fail with an error matching drover.ErrStoreFull that names usage
// and quota, and change nothing: not the head, not the writes, not the
// thread's fence. Once the key is gone the same writes succeed.
func TestEtcdStoreYieldsWhileStoreFull(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	cli := srv.Client(t)
	keys := keyspace.MustNew(ns)
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	held, err := locker.AcquireFenced(ctx, "thread-locked")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)

	// One checkpoint per thread before the store fills ("fresh" has none,
	// so its fence key does not exist yet).
	fences := map[string]checkpoint.Fence{"plain": nil, "token": token(7), "locked": held}
	heads := map[string]string{}
	for thread, f := range fences {
		cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: thread, State: []byte("before")}, f)
		if err != nil {
			t.Fatal(err)
		}
		heads[thread] = cp.ID
	}
	fences["fresh"] = token(3)

	full := &drover.StoreFullError{Usage: 47 << 20, Quota: 64 << 20, HighWater: 0.7, LowWater: 0.6}
	if err := storeguard.Set(ctx, cli, full, keys); err != nil {
		t.Fatal(err)
	}
	for thread, f := range fences {
		_, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: thread, ParentID: heads[thread], State: []byte("refused")}, f)
		checkStoreFull(t, "Put on "+thread, err)
		if heads[thread] != "" {
			err = s.PutWrites(ctx, thread, "", heads[thread], []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte("w")}}, f)
			checkStoreFull(t, "PutWrites on "+thread, err)
			if w, err := s.Writes(ctx, thread, "", heads[thread]); err != nil || len(w) != 0 {
				t.Fatalf("%s: refused PutWrites left %d writes (%v)", thread, len(w), err)
			}
		}
		latest, err := s.GetLatest(ctx, thread, "")
		switch {
		case heads[thread] == "" && !errors.Is(err, checkpoint.ErrNotFound):
			t.Fatalf("%s: a refused first Put left a head: %+v, %v", thread, latest, err)
		case heads[thread] != "" && (err != nil || latest.ID != heads[thread]):
			t.Fatalf("%s: head after a refused Put: %+v, %v; want %s", thread, latest, err, heads[thread])
		}
	}
	// The refused token write on "fresh" stored nothing of its own; it
	// created the thread's fence key at its token, as its holder's raise
	// would: a lower token, an earlier holder's, is refused from then on,
	// and the holder writes once the store has room.
	if err := storeguard.Clear(ctx, cli, keys); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "fresh", State: []byte("older")}, token(2)); !errors.Is(err, lease.ErrFenced) {
		t.Fatalf("fresh: Put under a token lower than the refused write's: %v, want ErrFenced", err)
	}
	for thread, f := range fences {
		cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: thread, ParentID: heads[thread], State: []byte("after")}, f)
		if err != nil {
			t.Fatalf("%s: Put once the store has room: %v", thread, err)
		}
		if err := s.PutWrites(ctx, thread, "", cp.ID, []checkpoint.Write{{TaskID: "t", Channel: "c", Value: []byte("w")}}, f); err != nil {
			t.Fatalf("%s: PutWrites once the store has room: %v", thread, err)
		}
	}
}

func checkStoreFull(t *testing.T, what string, err error) {
	t.Helper()
	var sf *drover.StoreFullError
	if !errors.Is(err, drover.ErrStoreFull) || !errors.As(err, &sf) {
		t.Fatalf("%s while the store is full: %v, want a *drover.StoreFullError", what, err)
	}
	for _, want := range []string{"47.0 MiB", "64.0 MiB", "drover tasks purge", "--quota-backend-bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("%s: %q does not say %q", what, err, want)
		}
	}
}

// TestStoreFullDoesNotReachPostgres: the PostgreSQL store ignores the guard
// key (its data is not in etcd).
func TestStoreFullDoesNotReachPostgres(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s checkpoint.Store, ns string) {
		if _, ok := s.(*checkpoint.Etcd); ok {
			return
		}
		ctx := context.Background()
		full := &drover.StoreFullError{Usage: 47 << 20, Quota: 64 << 20, HighWater: 0.7, LowWater: 0.6}
		if err := storeguard.Set(ctx, srv.Client(t), full, keyspace.MustNew(ns)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("x")}, token(1)); err != nil {
			t.Fatalf("PostgreSQL Put while etcd's guard key exists: %v", err)
		}
	})
}
