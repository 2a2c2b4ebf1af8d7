package redislock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/redislock"
	"github.com/redis/go-redis/v9"
)

// redisClient returns a client of a Redis of the test's own (see
// servicetest.Redis).
func redisClient(t *testing.T) *redis.Client {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: servicetest.Redis(t)})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

func newRedisLocker(t *testing.T, rdb *redis.Client, ns string, ttl time.Duration, id string) *redislock.Locker {
	t.Helper()
	l, err := redislock.New(rdb, redislock.Config{Namespace: ns, TTL: ttl, HolderID: id})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestRedisTokensIncrease(t *testing.T) {
	t.Parallel()
	rdb := redisClient(t)
	ns := etcdtest.Namespace(t)
	a := newRedisLocker(t, rdb, ns, 5*time.Second, "a")
	b := newRedisLocker(t, rdb, ns, 5*time.Second, "b")
	var last int64
	for i := 0; i < 30; i++ {
		lk := []*redislock.Locker{a, b}[i%2]
		l, err := lk.Acquire(context.Background(), "fenced")
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("holder %d got token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	// Redis lost its counter (a restart without persistence): tokens still
	// go up, from the clock.
	if err := rdb.Del(context.Background(), "drover:{"+ns+":fenced}:fence").Err(); err != nil {
		t.Fatal(err)
	}
	l, err := a.TryAcquire(context.Background(), "fenced")
	if err != nil || l.Token() <= last {
		t.Fatalf("after the counter was lost: token %v (%v), want above %d", l, err, last)
	}
	_ = l.Release(context.Background())
}

func TestRedisHeldReleaseAndStatus(t *testing.T) {
	t.Parallel()
	rdb := redisClient(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	a := newRedisLocker(t, rdb, ns, 5*time.Second, "worker-a")
	// b's client reports each script Redis answered, so that the bounded
	// wait below ends after b has asked at least once, however slow the
	// machine: a deadline of its own would race the first answer.
	bdb := redis.NewClient(&redis.Options{Addr: rdb.Options().Addr})
	t.Cleanup(func() { _ = bdb.Close() })
	answered := &scriptHook{}
	bdb.AddHook(answered)
	b := newRedisLocker(t, bdb, ns, 5*time.Second, "worker-b")
	la, err := a.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	var held *lock.HeldError
	if _, err := b.TryAcquire(ctx, "job"); !errors.As(err, &held) || held.Holder.ID != "worker-a" || held.Token != la.Token() {
		t.Fatalf("try-acquire of a held lock: %v", err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	answered.arm(cancel)
	if _, err := b.Acquire(wctx, "job"); !errors.Is(err, lock.ErrHeld) || !errors.Is(err, context.Canceled) {
		t.Fatalf("wait ended by its context: %v, want the lock held and the context's error", err)
	}
	if err := b.Release(ctx, "job", la.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release by another locker with the right token: %v", err)
	}
	if err := a.Release(ctx, "job", la.Token()+1); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release with a wrong token: %v", err)
	}
	st, err := b.Status(ctx, "job")
	if err != nil || !st.Held || st.Token != la.Token() || st.Holder.ID != "worker-a" || st.TTL <= 0 || st.TTL > 5*time.Second {
		t.Fatalf("status %+v (%v)", st, err)
	}
	list, err := b.List(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "job" {
		t.Fatalf("list %+v (%v)", list, err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(context.Cause(la.Context()), lock.ErrReleased) {
		t.Fatalf("cause after release: %v", context.Cause(la.Context()))
	}
	if st, _ := b.Status(ctx, "job"); st.Held {
		t.Fatalf("still held after release: %+v", st)
	}
}

// scriptHook calls its armed function once, after Redis answered a script
// (EVAL or EVALSHA) without error.
type scriptHook struct {
	mu    sync.Mutex
	armed func()
}

// arm makes the next answered script call f.
func (h *scriptHook) arm(f func()) {
	h.mu.Lock()
	h.armed = f
	h.mu.Unlock()
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if name := cmd.Name(); err == nil && (name == "eval" || name == "evalsha") {
			h.mu.Lock()
			f := h.armed
			h.armed = nil
			h.mu.Unlock()
			if f != nil {
				f()
			}
		}
		return err
	}
}

func TestRedisWatchdog(t *testing.T) {
	rdb := redisClient(t)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	a := newRedisLocker(t, rdb, ns, time.Second, "a")
	l, err := a.TryAcquire(ctx, "long")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // 2.5 TTLs: only renewals keep it
	if l.Context().Err() != nil {
		t.Fatalf("lost while renewed: %v", context.Cause(l.Context()))
	}
	if st, _ := a.Status(ctx, "long"); !st.Held || st.Token != l.Token() {
		t.Fatalf("status %+v", st)
	}
	// Someone else takes it (a failover, an operator): the watchdog sees
	// it and cancels the holder's context.
	if err := rdb.Set(ctx, "drover:{"+ns+":long}:holder", "999 other {}", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(30 * time.Second): // only against a hang: it checks every TTL/3
		t.Fatal("the watchdog did not notice the lock was taken")
	}
	if !errors.Is(context.Cause(l.Context()), lock.ErrLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
}

func TestRedisBadInput(t *testing.T) {
	t.Parallel()
	rdb := redisClient(t)
	for _, ttl := range []time.Duration{500 * time.Millisecond, 25 * time.Hour} {
		if _, err := redislock.New(rdb, redislock.Config{TTL: ttl}); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("ttl %s: %v", ttl, err)
		}
	}
	l := newRedisLocker(t, rdb, etcdtest.Namespace(t), time.Second, "a")
	for _, name := range []string{"", "a/b", "a}b", strings.Repeat("x", 129)} {
		if _, err := l.TryAcquire(context.Background(), name); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("name %q: %v", name, err)
		}
	}
}
