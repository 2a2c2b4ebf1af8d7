// Package etcdtest runs a real embedded etcd server for tests, and hands each
// test its own namespace so tests sharing one server cannot see each other.
package etcdtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
)

// Server is an embedded etcd server in a temporary directory.
type Server struct {
	*cluster.Server
	dir string
}

// Options change how Start runs the server.
type Options struct {
	// Fsync keeps etcd's fsync on (benchmarks); tests run without it.
	Fsync bool
	// Dir reuses a data directory (restarts); "" makes a new one that Stop
	// removes.
	Dir string
	// ClientURL pins the client address (restarts on the same address).
	ClientURL string
}

// Start starts an embedded etcd server on free loopback ports. A port
// found free can be taken by another process before etcd binds it (test
// binaries of several packages run at once): when neither the directory
// nor the address is pinned, Start tries again with new ports, up to five
// times.
func Start(opts Options) (*Server, error) {
	for try := 1; ; try++ {
		s, err := start(opts)
		if err == nil || try == 5 || opts.Dir != "" || opts.ClientURL != "" || !portTaken(err) {
			return s, err
		}
	}
}

// portTaken reports whether err says a listener's port was in use (etcd
// may not keep the system call's error in its chain, so its text counts).
func portTaken(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

// start is one attempt of Start.
func start(opts Options) (*Server, error) {
	dir, owned := opts.Dir, false
	if dir == "" {
		d, err := os.MkdirTemp("", "drover-etcd-")
		if err != nil {
			return nil, err
		}
		dir, owned = d, true
	}
	clientURL := opts.ClientURL
	if clientURL == "" {
		clientURL = "http://" + FreeAddr()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srv, err := cluster.Embed(ctx, cluster.EmbedConfig{
		DataDir:       dir,
		ClientURL:     clientURL,
		PeerURL:       "http://" + FreeAddr(),
		UnsafeNoFsync: !opts.Fsync,
	})
	if err != nil {
		if owned {
			_ = os.RemoveAll(dir)
		}
		return nil, err
	}
	s := &Server{Server: srv}
	if owned {
		s.dir = dir
	}
	return s, nil
}

// MustStart is Start for TestMain: it exits the test binary on failure.
func MustStart(opts Options) *Server {
	s, err := Start(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "etcdtest:", err)
		os.Exit(1)
	}
	return s
}

// Stop closes the server and removes its directory if Start made it.
func (s *Server) Stop() {
	_ = s.Close(context.Background())
	if s.dir != "" {
		_ = os.RemoveAll(s.dir)
	}
}

// ClientURL returns the first client endpoint as a URL.
func (s *Server) ClientURL() string { return "http://" + s.Endpoints()[0] }

// Client returns a new client of the server, closed when the test ends.
func (s *Server) Client(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli, err := cluster.Connect(context.Background(), cluster.ClientConfig{Endpoints: s.Endpoints()})
	if err != nil {
		tb.Fatalf("etcdtest: connect: %v", err)
	}
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

// LocalClient returns a client that calls the server in process, as the
// HTTP API of drover server does (cluster.Server.LocalClient), closed when
// the test ends.
func (s *Server) LocalClient(tb testing.TB) *clientv3.Client {
	tb.Helper()
	cli := s.Server.LocalClient()
	tb.Cleanup(func() { _ = cli.Close() })
	return cli
}

var nsSeq atomic.Int64

var unsafeChars = regexp.MustCompile(`[^A-Za-z0-9_.:-]+`)

// Namespace returns a namespace no other test of this process uses.
func Namespace(tb testing.TB) string {
	tb.Helper()
	name := unsafeChars.ReplaceAllString(tb.Name(), "-")
	if len(name) > 80 {
		name = name[:80]
	}
	return fmt.Sprintf("t%d-%d-%s", os.Getpid(), nsSeq.Add(1), name)
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr() string {
	addr, err := cluster.FreeLoopbackAddr()
	if err != nil {
		panic(err)
	}
	return addr
}

// LeakOptions are the goleak options for packages that run an embedded etcd:
// they ignore the few goroutines that etcd and its libraries leave behind for
// the life of the process.
func LeakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreTopFunction("github.com/golang/glog.(*fileSink).flushDaemon"),
		goleak.IgnoreAnyFunction("go.etcd.io/etcd/pkg/v3/schedule.(*fifo).run"),
	}
}

// Main runs a test package's tests against one embedded etcd, which it starts
// into *srv (nil srv: no server), and then checks for leaked goroutines. When
// the environment variable helperEnv is set, it runs helper with its value
// instead: tests re-execute the test binary that way to get real worker
// processes they can kill. Use it as os.Exit(etcdtest.Main(...)) in TestMain.
func Main(m *testing.M, srv **Server, helperEnv string, helper func(mode string) int) int {
	if helperEnv != "" {
		if mode := os.Getenv(helperEnv); mode != "" {
			return helper(mode)
		}
	}
	if srv != nil {
		*srv = MustStart(Options{})
	}
	code := m.Run()
	if srv != nil {
		(*srv).Stop()
	}
	if code == 0 {
		if err := goleak.Find(LeakOptions()...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// StartOwn starts a server for one test alone (a test that stops it), and
// returns it with a connected client; both end with the test.
func StartOwn(tb testing.TB) (*Server, *clientv3.Client) {
	tb.Helper()
	s, err := Start(Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(s.Stop)
	return s, s.Client(tb)
}
