// Package proctest runs lock holders in other processes for the tests of
// the lock backends: the test binary re-executes itself with Env set, and
// the package's TestMain hands the mode to a helper instead of running
// the tests. The helpers hold real locks, so tests can kill them with
// SIGKILL or pause them with SIGSTOP.
package proctest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/lock"
)

// Env names the helper mode in a helper process's environment.
const Env = "DROVER_LOCK_TEST_HELPER"

// Backend is what Exercise needs of a lock backend.
type Backend struct {
	// NewLocker makes a locker of the backend with the TTL below, closed
	// when t ends.
	NewLocker func(t *testing.T, ns, id string) lock.Locker
	// Hold is the helper mode that holds lock H_LOCK until told to CHECK
	// it (see HoldUntilChecked), Counter the one that counts under it
	// (see CountUnder); Env is the environment they need.
	Hold, Counter string
	Env           []string
}

var nsSeq atomic.Int64

// namespace returns a namespace of the test's own.
func namespace(t *testing.T) string {
	t.Helper()
	return fmt.Sprintf("proc-%d-%d", os.Getpid(), nsSeq.Add(1))
}

// Exercise runs the cross-process part of the conformance of b: mutual
// exclusion among two holder processes and four goroutines, and a holder
// killed (SIGKILL) or paused (SIGSTOP) losing the lock to a successor with
// a higher token within its TTL, the paused one knowing it lost the lock
// once it runs again.
func Exercise(t *testing.T, b Backend) {
	t.Run("mutual exclusion", func(t *testing.T) {
		ns := namespace(t)
		dir := t.TempDir()
		counter, logPath := filepath.Join(dir, "counter"), filepath.Join(dir, "log")
		// Two holder processes and four goroutines.
		var procs []*Helper
		for p := 0; p < 2; p++ {
			env := append([]string{"H_NS=" + ns, "H_LOCK=counter", "H_TTL=5s", "H_ITER=8",
				"H_COUNTER=" + counter, "H_LOG=" + logPath, fmt.Sprintf("H_ID=proc-%d", p)}, b.Env...)
			procs = append(procs, Start(t, b.Counter, env...))
		}
		var wg sync.WaitGroup
		errs := make(chan error, 6)
		for g := 0; g < 4; g++ {
			lk := b.NewLocker(t, ns, fmt.Sprintf("g%d", g))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 8; i++ {
					l, err := lk.Acquire(context.Background(), "counter")
					if err != nil {
						errs <- err
						return
					}
					if err := CriticalSection(counter, logPath, fmt.Sprintf("g%d", g)); err != nil {
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
			if err := p.Cmd.Wait(); err != nil {
				t.Fatalf("holder process: %v", err)
			}
		}
		if b, _ := os.ReadFile(counter); strings.TrimSpace(string(b)) != "48" {
			t.Fatalf("counter %s, want 48", b)
		}
	})
	t.Run("holder killed or paused", func(t *testing.T) {
		const ttl = 2 * time.Second
		for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
			ns := namespace(t)
			env := append([]string{"H_NS=" + ns, "H_LOCK=job", "H_TTL=" + ttl.String(), "H_ID=victim"}, b.Env...)
			h := Start(t, b.Hold, env...)
			old, _ := strconv.ParseInt(h.Line(t, "ACQUIRED"), 10, 64)
			_ = h.Cmd.Process.Signal(sig)
			ctx, cancel := context.WithTimeout(context.Background(), ttl+time.Second)
			l, err := b.NewLocker(t, ns, "successor").Acquire(ctx, "job")
			cancel()
			if err != nil {
				_ = h.Cmd.Process.Signal(syscall.SIGCONT)
				t.Fatalf("%s: no acquisition within TTL + 1s: %v", sig, err)
			}
			if l.Token() <= old {
				t.Fatalf("%s: token %d not above the old holder's %d", sig, l.Token(), old)
			}
			if sig == syscall.SIGSTOP {
				_ = h.Cmd.Process.Signal(syscall.SIGCONT)
				_, _ = h.Stdin.Write([]byte("CHECK\n"))
				if got := h.Line(t, "RESULT"); got != "lost=true" {
					t.Fatalf("paused holder after SIGCONT: %s", got)
				}
			}
			_ = l.Release(context.Background())
		}
	})
}

// CriticalSection increments the counter file and appends "id start end" to
// the log. Run by two holders at once it loses increments and overlaps.
func CriticalSection(counterPath, logPath, id string) error {
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

// Helper is a running helper process.
type Helper struct {
	Cmd    *exec.Cmd
	Stdin  io.WriteCloser
	stdout *bufio.Scanner
}

// Start re-executes the test binary as a helper process running mode,
// with env added to its environment; it is killed when t ends.
func Start(t *testing.T, mode string, env ...string) *Helper {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{Env + "=" + mode}, env...)...)
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
	h := &Helper{Cmd: cmd, Stdin: stdin, stdout: bufio.NewScanner(stdout)}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return h
}

// Line reads the helper's next line of output with the given prefix.
func (h *Helper) Line(t *testing.T, prefix string) string {
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

// HoldUntilChecked holds lock H_LOCK of locker until told to CHECK it,
// then reports whether it knows the lock is lost.
func HoldUntilChecked(ctx context.Context, locker lock.Locker) int {
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

// CountUnder runs H_ITER critical sections under lock H_LOCK of locker.
func CountUnder(ctx context.Context, locker lock.Locker) int {
	n, _ := strconv.Atoi(os.Getenv("H_ITER"))
	for i := 0; i < n; i++ {
		l, err := locker.Acquire(ctx, os.Getenv("H_LOCK"))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		if err := CriticalSection(os.Getenv("H_COUNTER"), os.Getenv("H_LOG"), os.Getenv("H_ID")); err != nil {
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
