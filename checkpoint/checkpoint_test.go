package checkpoint_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/checkpoint"
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

// eachStore runs f against the etcd store and the PostgreSQL store, each in
// a namespace of its own.
func eachStore(t *testing.T, f func(t *testing.T, s checkpoint.Store, ns string)) {
	t.Run("etcd", func(t *testing.T) {
		s, ns := newStore(t)
		f(t, s, ns)
	})
	t.Run("postgres", func(t *testing.T) {
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

func TestChainGetListDelete(t *testing.T) { eachStore(t, testChain) }

func testChain(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
	parent := ""
	var ids []string
	for i := 0; i < 5; i++ {
		src := "loop"
		if i == 0 {
			src = "input"
		}
		cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: parent, State: []byte(strconv.Itoa(i)),
			Metadata: checkpoint.Metadata{Source: src, Step: i, Writer: "w"}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		parent = cp.ID
		ids = append(ids, cp.ID)
		time.Sleep(time.Millisecond)
	}
	latest, err := s.GetLatest(ctx, "th", "")
	if err != nil || latest.ID != ids[4] || string(latest.State) != "4" || latest.ParentID != ids[3] {
		t.Fatalf("latest %+v (%v)", latest, err)
	}
	if got, err := s.Get(ctx, "th", "", ids[1]); err != nil || string(got.State) != "1" {
		t.Fatalf("get %+v (%v)", got, err)
	}
	list, err := s.List(ctx, "th", "", checkpoint.ListOptions{Before: ids[4], Limit: 2})
	if err != nil || len(list) != 2 || list[0].ID != ids[3] || list[1].ID != ids[2] {
		t.Fatalf("list before/limit: %+v (%v)", list, err)
	}
	list, err = s.List(ctx, "th", "", checkpoint.ListOptions{Filter: map[string]any{"source": "input"}})
	if err != nil || len(list) != 1 || list[0].ID != ids[0] {
		t.Fatalf("list filtered: %+v (%v)", list, err)
	}
	if err := s.PutWrites(ctx, "th", "", ids[4], []checkpoint.Write{{TaskID: "t1", Channel: "messages", Value: []byte("hi")}}, nil); err != nil {
		t.Fatal(err)
	}
	if ws, err := s.Writes(ctx, "th", "", ids[4]); err != nil || len(ws) != 1 || string(ws[0].Value) != "hi" {
		t.Fatalf("writes %+v (%v)", ws, err)
	}
	if err := s.PutWrites(ctx, "th", "", "nope", nil, nil); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("writes for a missing checkpoint: %v", err)
	}
	if err := s.DeleteThread(ctx, "th"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetLatest(ctx, "th", ""); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("after delete: %v", err)
	}
}

func TestOptimisticConflict(t *testing.T) { eachStore(t, testConflict) }

func testConflict(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
	root, _ := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("0")}, nil)
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: root.ID, State: []byte("a")}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: root.ID, State: []byte("b")}, nil)
	var ce *checkpoint.ConflictError
	if !errors.As(err, &ce) || ce.Head == root.ID || ce.Head == "" {
		t.Fatalf("second writer on the same parent: %v", err)
	}
	if latest, _ := s.GetLatest(ctx, "th", ""); string(latest.State) != "a" {
		t.Fatalf("the losing write got through: %q", latest.State)
	}
}

func TestTokenFence(t *testing.T) { eachStore(t, testTokenFence) }

func testTokenFence(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("by 5")}, token(5))
	if err != nil {
		t.Fatal(err)
	}
	// A writer whose lock expired (an older token) is refused...
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: cp.ID, State: []byte("by 3")}, token(3)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("older token: %v, want ErrFenced", err)
	}
	if err := s.PutWrites(ctx, "th", "", cp.ID, []checkpoint.Write{{TaskID: "t", Channel: "c"}}, token(4)); !errors.Is(err, lock.ErrFenced) {
		t.Fatalf("older token on writes: %v", err)
	}
	// ...and the newer holder goes on.
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", ParentID: cp.ID, State: []byte("by 7")}, token(7)); err != nil {
		t.Fatal(err)
	}
	if latest, _ := s.GetLatest(ctx, "th", ""); string(latest.State) != "by 7" || latest.Token != 7 {
		t.Fatalf("latest %+v", latest)
	}
}

func TestEtcdLockFence(t *testing.T) {
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
	cp, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: []byte("x")}, l.(*lock.EtcdLock))
	if err != nil {
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
func TestFiveWorkersThreeInvocations(t *testing.T) { eachStore(t, testFiveByThree) }

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

func TestBadInput(t *testing.T) { eachStore(t, testBadInput) }

func testBadInput(t *testing.T, s checkpoint.Store, _ string) {
	ctx := context.Background()
	if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "a/b"}, nil); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("bad thread id: %v", err)
	}
	if _, isEtcd := s.(*checkpoint.Etcd); isEtcd {
		if _, err := s.Put(ctx, checkpoint.Checkpoint{ThreadID: "th", State: make([]byte, checkpoint.MaxState+1)}, nil); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("oversize state: %v", err)
		}
	}
	if _, err := s.GetLatest(ctx, "th", ""); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Fatalf("nothing should have been written: %v", err)
	}
}
