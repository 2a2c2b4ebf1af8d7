package lock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/lock"
	"github.com/redis/go-redis/v9"
)

// backend makes lockers of one backend, each a separate holder identity.
type backend struct {
	name   string
	ttl    time.Duration
	locker func(t *testing.T, ns, id string) lock.Locker
	// helper is the helper process mode that holds a lock of this backend,
	// and the environment it needs.
	helper    string
	helperEnv []string
	counter   string // helper mode that counts under the lock
}

func backends(t *testing.T) []backend {
	rdb := redisClient(t)
	servers, _ := redisServers(t, 3)
	var addrs []string
	for _, c := range servers {
		addrs = append(addrs, c.(*redis.Client).Options().Addr)
	}
	pg := startPaxosGroup(t, paxosGroupSize)
	return []backend{
		{"etcd", 2 * time.Second, func(t *testing.T, ns, id string) lock.Locker {
			return newLocker(t, srv.Client(t), ns, 2*time.Second, id)
		}, "hold", nil, "counter"},
		{"redis", time.Second, func(t *testing.T, ns, id string) lock.Locker {
			return newRedisLocker(t, rdb, ns, time.Second, id)
		}, "redis-hold", []string{"H_REDIS=" + rdb.Options().Addr}, "redis-counter"},
		{"redlock", time.Second, func(t *testing.T, ns, id string) lock.Locker {
			l, err := lock.NewRedlock(servers, lock.RedlockConfig{Namespace: ns, TTL: time.Second, HolderID: id})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}, "redlock-hold", []string{"H_REDIS=" + strings.Join(addrs, ",")}, "redlock-counter"},
		{"paxos", time.Second, func(t *testing.T, ns, id string) lock.Locker {
			return newPaxosLocker(t, pg, ns, time.Second, id)
		}, "paxos-hold", []string{"H_PAXOS=" + strings.Join(pg.endpoints, ",")}, "paxos-counter"},
	}
}

// TestConformance runs the same suite against every lock backend: mutual
// exclusion, strictly increasing tokens, holder-only fenced release, and a
// watchdog that keeps a lock held for ten times its TTL.
func TestConformance(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("mutual exclusion", func(t *testing.T) {
				ns := etcdtest.Namespace(t)
				dir := t.TempDir()
				counter, logPath := filepath.Join(dir, "counter"), filepath.Join(dir, "log")
				// Two holder processes and four goroutines.
				var procs []*helper
				for p := 0; p < 2; p++ {
					env := append([]string{"H_NS=" + ns, "H_LOCK=counter", "H_TTL=5s", "H_ITER=8",
						"H_COUNTER=" + counter, "H_LOG=" + logPath, fmt.Sprintf("H_ID=proc-%d", p)}, b.helperEnv...)
					procs = append(procs, startHelper(t, b.counter, env...))
				}
				var wg sync.WaitGroup
				errs := make(chan error, 6)
				for g := 0; g < 4; g++ {
					lk := b.locker(t, ns, fmt.Sprintf("g%d", g))
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := 0; i < 8; i++ {
							l, err := lk.Acquire(context.Background(), "counter")
							if err != nil {
								errs <- err
								return
							}
							if err := criticalSection(counter, logPath, fmt.Sprintf("g%d", g)); err != nil {
								errs <- err
							}
							if err := l.Release(context.Background()); err != nil {
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
				for _, p := range procs {
					if err := p.cmd.Wait(); err != nil {
						t.Fatalf("holder process: %v", err)
					}
				}
				if b, _ := os.ReadFile(counter); strings.TrimSpace(string(b)) != "48" {
					t.Fatalf("counter %s, want 48", b)
				}
			})
			t.Run("tokens and release", func(t *testing.T) {
				ns := etcdtest.Namespace(t)
				x, y := b.locker(t, ns, "x"), b.locker(t, ns, "y")
				ctx := context.Background()
				var last int64
				for i := 0; i < 10; i++ {
					l, err := []lock.Locker{x, y}[i%2].Acquire(ctx, "k")
					if err != nil {
						t.Fatal(err)
					}
					if l.Token() <= last {
						t.Fatalf("token %d after %d", l.Token(), last)
					}
					last = l.Token()
					if i == 9 {
						// Neither another holder with the right token nor
						// the holder with a stale one may release it.
						if err := x.Release(ctx, "k", l.Token()); !errors.Is(err, lock.ErrNotHeld) {
							t.Fatalf("release by another holder: %v", err)
						}
						if err := y.Release(ctx, "k", l.Token()-1); !errors.Is(err, lock.ErrNotHeld) {
							t.Fatalf("release with a stale token: %v", err)
						}
					}
					if err := l.Release(ctx); err != nil {
						t.Fatal(err)
					}
					if err := l.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
						t.Fatalf("second release: %v", err)
					}
				}
			})
			t.Run("holder killed or paused", func(t *testing.T) {
				const ttl = 2 * time.Second
				for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
					ns := etcdtest.Namespace(t)
					env := append([]string{"H_NS=" + ns, "H_LOCK=job", "H_TTL=" + ttl.String(), "H_ID=victim"}, b.helperEnv...)
					h := startHelper(t, b.helper, env...)
					old, _ := strconv.ParseInt(h.line(t, "ACQUIRED"), 10, 64)
					_ = h.cmd.Process.Signal(sig)
					ctx, cancel := context.WithTimeout(context.Background(), ttl+time.Second)
					l, err := b.locker(t, ns, "successor").Acquire(ctx, "job")
					cancel()
					if err != nil {
						_ = h.cmd.Process.Signal(syscall.SIGCONT)
						t.Fatalf("%s: no acquisition within TTL + 1s: %v", sig, err)
					}
					if l.Token() <= old {
						t.Fatalf("%s: token %d not above the old holder's %d", sig, l.Token(), old)
					}
					if sig == syscall.SIGSTOP {
						_ = h.cmd.Process.Signal(syscall.SIGCONT)
						_, _ = h.stdin.Write([]byte("CHECK\n"))
						if got := h.line(t, "RESULT"); got != "lost=true" {
							t.Fatalf("paused holder after SIGCONT: %s", got)
						}
					}
					_ = l.Release(context.Background())
				}
			})
			t.Run("renewal keeps it for 10 TTLs", func(t *testing.T) {
				ns := etcdtest.Namespace(t)
				lk := b.locker(t, ns, "holder")
				l, err := lk.Acquire(context.Background(), "long")
				if err != nil {
					t.Fatal(err)
				}
				deadline := time.Now().Add(10 * b.ttl)
				other := b.locker(t, ns, "other")
				for time.Now().Before(deadline) {
					if l.Context().Err() != nil {
						t.Fatalf("lost while renewed: %v", context.Cause(l.Context()))
					}
					if _, err := other.TryAcquire(context.Background(), "long"); !errors.Is(err, lock.ErrHeld) {
						t.Fatalf("another holder got in: %v", err)
					}
					time.Sleep(b.ttl / 2)
				}
				if err := l.Release(context.Background()); err != nil {
					t.Fatal(err)
				}
			})
		})
	}
}
