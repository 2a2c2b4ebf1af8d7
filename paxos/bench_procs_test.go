package paxos_test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// benchPaxosProcs starts the group as users run it: three `drover paxos
// serve` processes over the direct transport, each with its own heap and
// collector, its own data dir and the default settings. In-process groups
// (benchPaxos) share one heap: every collection marks all three nodes'
// memories at once and takes the CPU from all three. It returns the
// nodes' API bases, and stops the processes (SIGTERM) when b ends.
func benchPaxosProcs(b *testing.B) []string {
	dir := b.TempDir()
	bin := filepath.Join(dir, "drover")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/droverhq/drover/cmd/drover").CombinedOutput(); err != nil {
		b.Fatalf("go build drover: %v\n%s", err, out)
	}
	var addrs, peers []string
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		addrs = append(addrs, ln.Addr().String())
		peers = append(peers, fmt.Sprintf("%d=%s", i, ln.Addr()))
		_ = ln.Close() // the node listens there; loopback ports are not reused at once
	}
	var bases []string
	for i, addr := range addrs {
		logPath := filepath.Join(dir, fmt.Sprintf("node-%d.log", i))
		logf, err := os.Create(logPath)
		if err != nil {
			b.Fatal(err)
		}
		cmd := exec.Command(bin, "paxos", "serve", "--id", fmt.Sprint(i), "--peers", strings.Join(peers, ","),
			"--transport", "direct", "--listen", addr, "--group", "bench", "--data-dir", filepath.Join(dir, fmt.Sprintf("node-%d", i)))
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.Env = append(os.Environ(), "RABBITMQ_URL=")
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			_ = logf.Close()
			if b.Failed() {
				out, _ := os.ReadFile(logPath)
				b.Logf("node %d's output:\n%s", i, out)
			}
		})
		bases = append(bases, "http://"+addr)
	}
	return benchReady(b, bases)
}
