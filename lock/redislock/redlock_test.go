package redislock_test

import (
	"context"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/lock/redislock"
	"github.com/redis/go-redis/v9"
)

// redisServers starts n independent Redis servers on free loopback ports,
// stopped when the test ends.
func redisServers(t *testing.T, n int) ([]redis.UniversalClient, []*exec.Cmd) {
	t.Helper()
	var clients []redis.UniversalClient
	var cmds []*exec.Cmd
	for i := 0; i < n; i++ {
		addr, cmd := servicetest.RedisServer(t)
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 500 * time.Millisecond})
		t.Cleanup(func() { _ = c.Close() })
		clients, cmds = append(clients, c), append(cmds, cmd)
	}
	return clients, cmds
}

func TestRedlock(t *testing.T) {
	t.Parallel()
	clients, cmds := redisServers(t, 3)
	ns := etcdtest.Namespace(t)
	ctx := context.Background()
	newRL := func(id string) *redislock.Redlock {
		rl, err := redislock.NewRedlock(clients, redislock.RedlockConfig{Namespace: ns, TTL: 2 * time.Second, HolderID: id})
		if err != nil {
			t.Fatal(err)
		}
		return rl
	}
	a, b := newRL("a"), newRL("b")

	var last int64
	for i := 0; i < 20; i++ {
		l, err := []*redislock.Redlock{a, b}[i%2].Acquire(ctx, "job")
		if err != nil {
			t.Fatal(err)
		}
		if l.Token() <= last {
			t.Fatalf("holder %d token %d after %d", i, l.Token(), last)
		}
		last = l.Token()
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}

	la, err := a.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	var held *lock.HeldError
	if _, err := b.TryAcquire(ctx, "job"); !errors.As(err, &held) || held.Holder.ID != "a" {
		t.Fatalf("held lock: %v", err)
	}
	if st, err := b.Status(ctx, "job"); err != nil || !st.Held || st.Token != la.Token() || st.Holder.ID != "a" {
		t.Fatalf("status %+v (%v), want a with token %d", st, err, la.Token())
	}
	if err := b.Release(ctx, "job", la.Token()); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("release by another locker: %v", err)
	}
	time.Sleep(3 * time.Second) // 1.5 TTLs: the watchdog keeps it
	if la.Context().Err() != nil {
		t.Fatalf("lost while renewed: %v", context.Cause(la.Context()))
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}

	// One server of three down: a majority still grants the lock, with a
	// token above every earlier one.
	_ = cmds[0].Process.Kill()
	_ = cmds[0].Wait()
	l, err := a.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatalf("with one server down: %v", err)
	}
	if l.Token() <= la.Token() {
		t.Fatalf("token %d not above %d", l.Token(), la.Token())
	}
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Two down: no majority, and the error says so.
	_ = cmds[1].Process.Kill()
	_ = cmds[1].Wait()
	if _, err := a.TryAcquire(ctx, "job"); err == nil || !strings.Contains(err.Error(), "of 3 servers answered") {
		t.Fatalf("with two servers down: %v", err)
	}
}

func TestRedlockBadInput(t *testing.T) {
	t.Parallel()
	rdb := redisClient(t)
	two := []redis.UniversalClient{rdb, rdb}
	if _, err := redislock.NewRedlock(two, redislock.RedlockConfig{}); !errors.Is(err, drover.ErrInvalidInput) || !strings.Contains(err.Error(), "odd number") {
		t.Fatalf("two servers: %v", err)
	}
	three := []redis.UniversalClient{rdb, rdb, rdb}
	if _, err := redislock.NewRedlock(three, redislock.RedlockConfig{TTL: 100 * time.Millisecond}); !errors.Is(err, drover.ErrInvalidInput) {
		t.Fatalf("ttl: %v", err)
	}
}

// Redis restarted (without persistence) under a held lock: the holder's
// watchdog finds the lock gone and cancels its context, so it stops writing.
func TestRedisRestartedUnderHolder(t *testing.T) {
	t.Parallel()
	clients, cmds := redisServers(t, 1)
	addr := clients[0].(*redis.Client).Options().Addr
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	ns := etcdtest.Namespace(t)
	lk, err := redislock.New(clients[0], redislock.Config{Namespace: ns, TTL: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l, err := lk.TryAcquire(context.Background(), "job")
	if err != nil {
		t.Fatal(err)
	}
	_ = cmds[0].Process.Kill()
	_ = cmds[0].Wait()
	restarted := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := restarted.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = restarted.Process.Kill(); _ = restarted.Wait() })
	select {
	case <-l.Context().Done():
	case <-time.After(30 * time.Second): // only against a hang
		t.Fatal("the holder did not learn that Redis lost its lock")
	}
	if !errors.Is(context.Cause(l.Context()), lock.ErrLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	if err := l.(*redislock.Lock).Err(); !errors.Is(err, lock.ErrLost) {
		t.Fatalf("Err() = %v", err)
	}
}

// A release by token through the holding Redlock ends the holding's
// context at once, as the lock's own Release does, and so its watchdog: it
// does not renew in vain until the validity time runs out.
func TestRedlockReleaseByTokenEndsHolding(t *testing.T) {
	t.Parallel()
	clients, _ := redisServers(t, 3)
	rl, err := redislock.NewRedlock(clients, redislock.RedlockConfig{Namespace: etcdtest.Namespace(t), TTL: 30 * time.Second, HolderID: "a"})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	l, err := rl.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Release(ctx, "job", l.Token()); err != nil {
		t.Fatal(err)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, lock.ErrReleased) {
		t.Fatalf("holding's context after release by token: %v, want ErrReleased", cause)
	}
	if err := l.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("second release: %v, want ErrNotHeld", err)
	}
	// The locker forgot the holding: a new one is released by its token.
	l2, err := rl.TryAcquire(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	if err := rl.Release(ctx, "job", l2.Token()); err != nil || !errors.Is(context.Cause(l2.Context()), lock.ErrReleased) {
		t.Fatalf("second holding: release %v, cause %v", err, context.Cause(l2.Context()))
	}
}
