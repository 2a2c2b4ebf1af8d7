package lock_test

// Helper processes: the test binary re-executes itself with helperEnv set, and
// TestMain runs one of these instead of the tests. They are real OS processes
// that hold real locks, so tests can kill them with SIGKILL or pause them with
// SIGSTOP.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/lock"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const helperEnv = "DROVER_LOCK_TEST_HELPER"

func runHelper(mode string) int {
	ctx := context.Background()
	if mode == "redis-hold" || mode == "redlock-hold" || mode == "redis-counter" || mode == "redlock-counter" {
		return runRedisHelper(ctx, mode)
	}
	if mode == "paxos-hold" || mode == "paxos-counter" {
		return runPaxosHelper(ctx, mode)
	}
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	locker, err := lock.NewEtcd(ctx, cli, lock.EtcdConfig{Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer locker.Close(ctx)
	name := os.Getenv("H_LOCK")
	switch mode {
	case "counter":
		return countUnder(ctx, locker)
	case "hold":
		l, err := locker.Acquire(ctx, name)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		el := l.(*lock.EtcdLock)
		lctx := el.Context()
		fmt.Printf("ACQUIRED %d\n", el.Token())
		in := bufio.NewScanner(os.Stdin)
		for in.Scan() {
			if in.Text() == "CHECK" {
				fmt.Printf("RESULT lost=%t\n", errors.Is(el.Err(), lock.ErrLost))
				return 0
			}
			if in.Text() != "WRITE" {
				continue
			}
			// The lock context must end by itself once the process runs
			// again (the renewal deadline passed while it was stopped),
			// before anything here looks at the lock.
			cancelled := false
			select {
			case <-lctx.Done():
				cancelled = true
			case <-time.After(200 * time.Millisecond):
			}
			errNow := el.Err()
			raw, rerr := cli.Txn(ctx).If(el.Cmp()).Then(clientv3.OpPut(os.Getenv("H_DATA"), "stale write")).Commit()
			rawApplied := rerr == nil && raw.Succeeded
			_, ferr := el.Txn(ctx).Then(clientv3.OpPut(os.Getenv("H_DATA"), "stale write")).Commit()
			fmt.Printf("RESULT cancelled=%t lost=%t raw_applied=%t fenced=%t\n",
				cancelled, errors.Is(errNow, lock.ErrLost), rawApplied, errors.Is(ferr, lock.ErrFenced))
			return 0
		}
		return 0
	}
	fmt.Fprintln(os.Stderr, "unknown helper mode", mode)
	return 2
}

// criticalSection increments the counter file and appends "id start end" to
// the log. Run by two holders at once it loses increments and overlaps.
func criticalSection(counterPath, logPath, id string) error {
	start := time.Now().UnixNano()
	b, err := os.ReadFile(counterPath)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	time.Sleep(500 * time.Microsecond)
	if err := os.WriteFile(counterPath, []byte(strconv.Itoa(n+1)), 0o644); err != nil {
		return err
	}
	end := time.Now().UnixNano()
	f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(f, "%s %d %d\n", id, start, end)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// helper is a running helper process.
type helper struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Scanner
}

func startHelper(t *testing.T, mode string, env ...string) *helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{helperEnv + "=" + mode, "H_ENDPOINTS=" + strings.Join(srv.Endpoints(), ",")}, env...)...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	h := &helper{cmd: cmd, stdin: stdin, stdout: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// line reads the helper's next line of output with the given prefix.
func (h *helper) line(t *testing.T, prefix string) string {
	t.Helper()
	got := make(chan string, 1)
	go func() {
		for h.stdout.Scan() {
			if s := h.stdout.Text(); strings.HasPrefix(s, prefix) {
				got <- strings.TrimSpace(strings.TrimPrefix(s, prefix))
				return
			}
		}
		close(got)
	}()
	select {
	case s, ok := <-got:
		if !ok {
			t.Fatalf("helper ended before printing %q", prefix)
		}
		return s
	case <-time.After(30 * time.Second):
		t.Fatalf("helper printed no %q within 30s", prefix)
	}
	return ""
}

// runRedisHelper holds a Redis lock until told to CHECK it, then reports
// whether it knows the lock is lost.
func runRedisHelper(ctx context.Context, mode string) int {
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	var clients []redis.UniversalClient
	for _, addr := range strings.Split(os.Getenv("H_REDIS"), ",") {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		clients = append(clients, c)
	}
	var locker lock.Locker
	var err error
	if mode == "redlock-hold" || mode == "redlock-counter" {
		locker, err = lock.NewRedlock(clients, lock.RedlockConfig{Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	} else {
		locker, err = lock.NewRedis(clients[0], lock.RedisConfig{Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if strings.HasSuffix(mode, "-counter") {
		return countUnder(ctx, locker)
	}
	return holdUntilChecked(ctx, locker)
}

// runPaxosHelper is runRedisHelper for the paxos group at H_PAXOS.
func runPaxosHelper(ctx context.Context, mode string) int {
	ttl, _ := time.ParseDuration(os.Getenv("H_TTL"))
	locker, err := lock.NewPaxos(lock.PaxosConfig{Endpoints: strings.Split(os.Getenv("H_PAXOS"), ","), Namespace: os.Getenv("H_NS"), TTL: ttl, HolderID: os.Getenv("H_ID")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer locker.Close()
	if mode == "paxos-counter" {
		return countUnder(ctx, locker)
	}
	return holdUntilChecked(ctx, locker)
}

// holdUntilChecked holds lock H_LOCK of locker until told to CHECK it,
// then reports whether it knows the lock is lost.
func holdUntilChecked(ctx context.Context, locker lock.Locker) int {
	l, err := locker.Acquire(ctx, os.Getenv("H_LOCK"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("ACQUIRED %d\n", l.Token())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "CHECK" {
			e, _ := l.(interface{ Err() error })
			fmt.Printf("RESULT lost=%t\n", e != nil && errors.Is(e.Err(), lock.ErrLost))
			return 0
		}
	}
	return 0
}

// countUnder runs H_ITER critical sections under lock H_LOCK of locker.
func countUnder(ctx context.Context, locker lock.Locker) int {
	n, _ := strconv.Atoi(os.Getenv("H_ITER"))
	for i := 0; i < n; i++ {
		l, err := locker.Acquire(ctx, os.Getenv("H_LOCK"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := criticalSection(os.Getenv("H_COUNTER"), os.Getenv("H_LOG"), os.Getenv("H_ID")); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := l.Release(ctx); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	}
	return 0
}
