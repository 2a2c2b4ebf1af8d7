// Package servicetest gives tests the Redis and PostgreSQL servers they need:
// a redis-server of their own on a free loopback port when the binary exists
// (REDIS_URL otherwise), and the PostgreSQL at DATABASE_URL (default
// postgres://127.0.0.1:5432/test). When one is missing, the test is skipped
// with a message, unless DROVER_REQUIRE_SERVICES=1 (which .ci/run sets): then
// it fails.
package servicetest

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// missing skips or fails the test, as DROVER_REQUIRE_SERVICES says.
func missing(tb testing.TB, format string, args ...any) {
	tb.Helper()
	if os.Getenv("DROVER_REQUIRE_SERVICES") == "1" {
		tb.Fatalf(format+" (DROVER_REQUIRE_SERVICES=1)", args...)
	}
	tb.Skipf(format+"; skipping (set DROVER_REQUIRE_SERVICES=1 to fail instead)", args...)
}

// RedisServer starts a redis-server of the test's own on a free loopback
// port, stopped when the test ends, and returns its address and the
// command (tests kill it to simulate a crash).
func RedisServer(tb testing.TB) (string, *exec.Cmd) {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(tb, "no redis-server binary to start")
		return "", nil
	}
	addr, err := cluster.FreeLoopbackAddr()
	if err != nil {
		tb.Fatal(err)
	}
	port := addr[strings.LastIndexByte(addr, ':')+1:]
	cmd := exec.Command("redis-server", "--bind", "127.0.0.1", "--port", port, "--save", "", "--appendonly", "no", "--dir", tb.TempDir())
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start redis-server: %v", err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			tb.Fatalf("redis-server on %s did not come up", addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return addr, cmd
}

// Redis returns the address of a Redis for the test: its own redis-server
// when the binary exists, else the one at REDIS_URL.
func Redis(tb testing.TB) string {
	tb.Helper()
	if _, err := exec.LookPath("redis-server"); err == nil {
		addr, _ := RedisServer(tb)
		return addr
	}
	url := os.Getenv("REDIS_URL")
	if url == "" {
		missing(tb, "no redis-server binary and no REDIS_URL")
		return ""
	}
	opt, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("REDIS_URL %q: %v", url, err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		missing(tb, "Redis at REDIS_URL %s does not answer: %v", url, err)
	}
	return opt.Addr
}

// DefaultDatabaseURL is used when DATABASE_URL is not set.
const DefaultDatabaseURL = "postgres://127.0.0.1:5432/test"

// Postgres returns a pool on the PostgreSQL at DATABASE_URL, closed when the
// test ends.
func Postgres(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	url := os.Getenv("DATABASE_URL")
	if url == "" {
		url = DefaultDatabaseURL
	}
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatalf("DATABASE_URL %q: %v", url, err)
	}
	tb.Cleanup(pool.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pool.Ping(ctx); err != nil {
		missing(tb, "PostgreSQL at %s does not answer: %v", url, err)
	}
	return pool
}

// PostgresURL is the URL Postgres connects to.
func PostgresURL() string {
	if url := os.Getenv("DATABASE_URL"); url != "" {
		return url
	}
	return DefaultDatabaseURL
}
