package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/checkpoint"
	"github.com/droverhq/drover/checkpoint/checkpointtest"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
	"github.com/droverhq/drover/lock"
)

type token int64

func (t token) Token() int64 { return int64(t) }

func newStore(t *testing.T) (*checkpoint.Etcd, string) {
	t.Helper()
	ns := etcdtest.Namespace(t)
	s, err := checkpoint.NewEtcd(srv.Client(t), ns)
	if err != nil {
		t.Fatal(err)
	}
	return s, ns
}

// TestStoreConformance runs the checkpoint.Store suite against the etcd
// store and the PostgreSQL store, each subtest in a namespace of its own.
func TestStoreConformance(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		checkpointtest.Exercise(ctx, t, func(t *testing.T) checkpoint.Store {
			s, _ := newStore(t)
			return s
		}, checkpointtest.Options{MaxState: checkpoint.MaxState})
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		pool := servicetest.Postgres(t)
		checkpointtest.Exercise(ctx, t, func(t *testing.T) checkpoint.Store {
			s, err := checkpoint.NewPostgres(ctx, pool, etcdtest.Namespace(t))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}, checkpointtest.Options{})
	})
}

// eachStore runs f against the etcd store and the PostgreSQL store, each in
// a namespace of its own.
func eachStore(t *testing.T, f func(t *testing.T, s checkpoint.Store, ns string)) {
	t.Run("etcd", func(t *testing.T) {
		t.Parallel()
		s, ns := newStore(t)
		f(t, s, ns)
	})
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool := servicetest.Postgres(t)
		ns := etcdtest.Namespace(t)
		s, err := checkpoint.NewPostgres(ctx, pool, ns)
		if err != nil {
			t.Fatal(err)
		}
		f(t, s, ns)
	})
}

func TestEtcdLockFence(t *testing.T) {
	t.Parallel()
	s, ns := newStore(t)
	ctx := context.Background()
	locker, err := lock.NewEtcd(ctx, srv.Client(t), lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(ctx)
	l, err := locker.Acquire(ctx, "thread-th")
	if err != nil {
		t.Fatal(err)
	}
	// The largest state, under the lock's fence and the thread's token
	// fence both.
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: make([]byte, checkpoint.MaxState)}, l.(*lock.EtcdLock))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Append(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: cp.ID, State: make([]byte, checkpoint.MaxState)}, l.(*lock.EtcdLock)); err != nil {
		t.Fatal(err)
	}
	_ = l.Release(ctx)
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: cp.ID, State: []byte("late")}, l.(*lock.EtcdLock)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("write under a released lock: %v", err)
	}
}

// The lost-update experiment: 5 workers, 3 invocations each, on one thread; every
// invocation reads the head, "calls the LLM", and writes a checkpoint. With
// either protection all 15 updates survive, as one chain.
func TestFiveWorkersThreeInvocations(t *testing.T) {
	t.Parallel()
	eachStore(t, testFiveByThree)
}

func testFiveByThree(t *testing.T, s checkpoint.Store, ns string) {
	for _, mode := range []string{"locked", "optimistic"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			if err := s.DeleteThread(ctx, "th"); err != nil {
				t.Fatal(err)
			}
			root, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("0")}, nil)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			errs := make(chan error, 5)
			for w := 0; w < 5; w++ {
				var locker *lock.Etcd
				if mode == "locked" {
					locker, err = lock.NewEtcd(ctx, srv.Client(t), lock.EtcdConfig{Namespace: ns, TTL: 5 * time.Second})
					if err != nil {
						t.Fatal(err)
					}
					defer locker.Close(ctx)
				}
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 3; i++ {
						if err := invoke(ctx, s, locker, fmt.Sprintf("w%d", w)); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			latest, _ := s.GetLatest(ctx, "th", "")
			if string(latest.State) != "15" {
				t.Fatalf("final count %s, want 15: updates were lost", latest.State)
			}
			all, _ := s.List(ctx, "th", "", checkpoint.ListOptions{Limit: 100})
			if len(all) != 16 {
				t.Fatalf("%d checkpoints, want 16", len(all))
			}
			for i := 0; i < len(all)-1; i++ { // newest first: each points at the next
				if all[i].ParentID != all[i+1].ID {
					t.Fatalf("the chain breaks at %s", all[i].ID)
				}
			}
			if all[len(all)-1].ID != root.ID {
				t.Fatal("the chain does not end at the root")
			}
		})
	}
}

// invoke is one read-modify-write of the thread: locked (the lock held across
// the slow call and passed as the fence) or optimistic (retry on conflict).
func invoke(ctx context.Context, s checkpoint.Store, locker *lock.Etcd, worker string) error {
	for {
		var fence checkpoint.Fence
		var l lock.Lock
		if locker != nil {
			var err error
			if l, err = locker.Acquire(ctx, "thread-th"); err != nil {
				return err
			}
			fence = l.(*lock.EtcdLock)
		}
		head, err := s.GetLatest(ctx, "th", "")
		if err != nil {
			return err
		}
		n, _ := strconv.Atoi(string(head.State))
		time.Sleep(5 * time.Millisecond) // the LLM call
		_, err = s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: head.ID, State: []byte(strconv.Itoa(n + 1)),
			Metadata: checkpoint.Metadata{Source: "loop", Writer: worker}}, fence)
		if l != nil {
			_ = l.Release(ctx)
		}
		if errors.Is(err, checkpoint.ErrConflict) && locker == nil {
			continue // someone else wrote first: reload and redo the step
		}
		return err
	}
}
