package lock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/etcdtest"
	"github.com/droverhq/drover/lock"
)

// backend makes lockers of one backend, each a separate holder identity.
type backend struct {
	name   string
	ttl    time.Duration
	locker func(t *testing.T, ns, id string) lock.Locker
}

func backends(t *testing.T) []backend {
	rdb := redisClient(t)
	servers, _ := redisServers(t, 3)
	return []backend{
		{"etcd", 2 * time.Second, func(t *testing.T, ns, id string) lock.Locker {
			return newLocker(t, srv.Client(t), ns, 2*time.Second, id)
		}},
		{"redis", time.Second, func(t *testing.T, ns, id string) lock.Locker {
			return newRedisLocker(t, rdb, ns, time.Second, id)
		}},
		{"redlock", time.Second, func(t *testing.T, ns, id string) lock.Locker {
			l, err := lock.NewRedlock(servers, lock.RedlockConfig{Namespace: ns, TTL: time.Second, HolderID: id})
			if err != nil {
				t.Fatal(err)
			}
			return l
		}},
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
				var wg sync.WaitGroup
				errs := make(chan error, 6)
				for g := 0; g < 6; g++ {
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
