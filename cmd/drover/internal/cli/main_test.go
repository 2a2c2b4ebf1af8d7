package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

var (
	srv       *etcdtest.Server
	droverBin string
)

// TestMain builds the drover binary once and starts an embedded etcd: the
// tests run the real binary as a user would.
func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "drover-cli-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	droverBin = filepath.Join(dir, "drover")
	build := exec.Command("go", "build", "-o", droverBin, "github.com/droverhq/drover/cmd/drover")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build drover:", err)
		os.Exit(1)
	}
	code := etcdtest.Main(m, &srv, "", nil)
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// result is how a drover run ended.
type result struct {
	code           int
	stdout, stderr string
}

// cleanEnv is the environment without ETCD_ENDPOINTS, so that tests say
// where etcd is, and without the OpenTelemetry variables (OTEL_*,
// TRACEPARENT, TRACESTATE, BAGGAGE), so that a traced shell neither turns
// tracing on in the binary nor parents its spans: tests that trace say so.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		switch {
		case name == "ETCD_ENDPOINTS", strings.HasPrefix(name, "OTEL_"),
			name == "TRACEPARENT", name == "TRACESTATE", name == "BAGGAGE":
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// drover runs the binary to completion (bounded by 60 s).
func drover(t *testing.T, args ...string) result {
	t.Helper()
	return droverIn(t, nil, args...)
}

// droverIn runs the binary with stdin to completion (bounded by 60 s).
func droverIn(t *testing.T, stdin []byte, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, droverBin, args...)
	cmd.Env = cleanEnv()
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	if ee, ok := err.(*exec.ExitError); ok {
		r.code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("run drover %v: %v", args, err)
	}
	return r
}

// etcdFlags point a command at the test server, in namespace ns.
func etcdFlags(ns string) []string {
	return []string{"--etcd-endpoints", strings.Join(srv.Endpoints(), ","), "--namespace", ns}
}

// process is a drover process running in the background.
type process struct {
	cmd            *exec.Cmd
	stdout, stderr *syncBuffer
	done           chan struct{}
	code           int
}

func start(t *testing.T, env []string, args ...string) *process {
	t.Helper()
	return startIn(t, "", env, args...)
}

// startIn starts drover in directory dir ("" for the test's own).
func startIn(t *testing.T, dir string, env []string, args ...string) *process {
	t.Helper()
	p := &process{cmd: exec.Command(droverBin, args...), stdout: &syncBuffer{}, stderr: &syncBuffer{}, done: make(chan struct{})}
	p.cmd.Env = env
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				p.code = 128 + int(ws.Signal())
			}
		}
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// wait waits for the process to end and returns its exit code.
func (p *process) wait(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(d):
		t.Fatalf("drover still running after %s; stderr:\n%s", d, p.stderr.String())
	}
	return -1
}

// waitFor polls cond (reading local buffers or files, never etcd) until it
// holds or d passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startWorkers starts n drover worker processes with the same arguments
// (after "worker") against the test server, in namespace ns.
func startWorkers(t *testing.T, ns string, n int, args ...string) []*process {
	t.Helper()
	ws := make([]*process, n)
	for i := range ws {
		ws[i] = start(t, cleanEnv(), append(append(etcdFlags(ns), "worker"), args...)...)
	}
	return ws
}

// waitWorkers waits for every worker to exit 0 within d.
func waitWorkers(t *testing.T, ws []*process, d time.Duration) {
	t.Helper()
	for i, w := range ws {
		if code := w.wait(t, d); code != 0 {
			t.Fatalf("worker %d exit %d: %s", i, code, w.stderr.String())
		}
	}
}
