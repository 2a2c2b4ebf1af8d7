package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisServer is a redis-server of the test's own on a loopback port, kept
// on that port and its directory across restarts.
type redisServer struct {
	t    *testing.T
	addr string
	args []string
	log  *os.File
	proc *process
	cli  *redis.Client
}

// startRedis starts redis-server with extra arguments (persistence
// settings). Without the binary the test is skipped, or fails under
// DROVER_REQUIRE_SERVICES=1, as the repo's other Redis tests do.
func startRedis(t *testing.T, extra ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("DROVER_REQUIRE_SERVICES") == "1" {
			t.Fatal("no redis-server binary (DROVER_REQUIRE_SERVICES=1)")
		}
		t.Skip("no redis-server binary; skipping (set DROVER_REQUIRE_SERVICES=1 to fail instead)")
	}
	addr := freeAddr(t)
	dir := dataDir(t)
	s := &redisServer{t: t, addr: addr,
		args: append([]string{"--bind", "127.0.0.1", "--port", addr[strings.LastIndexByte(addr, ':')+1:], "--dir", dir}, extra...)}
	f, err := os.Create(filepath.Join(dir, "redis.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.Close() })
	s.log = f
	s.cli = redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { _ = s.cli.Close() })
	s.start()
	if _, err := s.waitReady(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	return s
}

func (s *redisServer) start() {
	s.proc = startProcess(s.t, "redis-server", s.log, s.log, nil, "redis-server", s.args...)
}

// waitReady waits until the server answers PING.
func (s *redisServer) waitReady(d time.Duration) (time.Time, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := s.cli.Ping(ctx).Err()
		cancel()
		if err == nil {
			return time.Now(), nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("redis-server on %s did not answer within %s; its log: %s", s.addr, d, s.log.Name())
}

// killAndRestart kills redis-server with SIGKILL and starts it again at
// once, on the same port and directory.
func (s *redisServer) killAndRestart() outage {
	o := outage{member: "redis"}
	_ = s.proc.signal(syscall.SIGKILL)
	o.killed = time.Now()
	<-s.proc.done
	s.start()
	ready, err := s.waitReady(30 * time.Second)
	if err != nil {
		s.t.Fatal(err)
	}
	o.ready = ready
	return o
}
