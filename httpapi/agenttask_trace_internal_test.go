package httpapi

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
)

// TestAgentTraceStoredOnlyUnderItsClaim: a claim lost before its
// traceparent is stored (its lock key gone from etcd, the holder not yet
// told) stores nothing, and says it was fenced; one held stores it.
func TestAgentTraceStoredOnlyUnderItsClaim(t *testing.T) {
	t.Parallel()
	_, cli := etcdtest.StartOwn(t)
	s, err := New(Config{Etcd: cli, Namespace: etcdtest.Namespace(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	locker, err := s.locker(ctx, nil, lock.NewHolder("runner"))
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	store, err := s.taskStore(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := s.keys(ctx).TaskTrace("lost")
	l, err := locker.TryAcquireFenced(ctx, keyspace.TaskLock("lost"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Delete(ctx, l.Key()); err != nil {
		t.Fatal(err)
	}
	if got, err := store.KeepTraceParent(ctx, l, "lost", tp); !errors.Is(err, lease.ErrFenced) || got != "" {
		t.Fatalf("a lost claim's store: %q, %v; want an error matching lease.ErrFenced", got, err)
	}
	if r, err := cli.Get(ctx, key); err != nil || len(r.Kvs) != 0 {
		t.Fatalf("a lost claim stored %v (%v)", r.Kvs, err)
	}
	held, err := locker.TryAcquireFenced(ctx, keyspace.TaskLock("held"))
	if err != nil {
		t.Fatal(err)
	}
	if got, err := store.KeepTraceParent(ctx, held, "held", tp); err != nil || got != tp {
		t.Fatalf("a held claim's store: %q, %v; want %s", got, err, tp)
	}
	if r, err := cli.Get(ctx, s.keys(ctx).TaskTrace("held")); err != nil || len(r.Kvs) != 1 || string(r.Kvs[0].Value) != tp {
		t.Fatalf("the held claim's traceparent: %v (%v)", r.Kvs, err)
	}
}
