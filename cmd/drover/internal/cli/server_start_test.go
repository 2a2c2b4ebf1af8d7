package cli_test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/spf13/cobra"
)

func serverArgs(dataDir string) []string {
	return []string{"server", "--data-dir", dataDir, "--etcd-listen", "http://" + etcdtest.FreeAddr(), "--etcd-peer-listen", "http://" + etcdtest.FreeAddr()}
}

// TestSecondServerOnOneDataDir: a second server on a data dir in use fails
// within seconds, naming the first one's pid, exit 2. It used to wait in
// etcd's database lock forever, deaf to SIGTERM.
func TestSecondServerOnOneDataDir(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	first := start(t, cleanEnv(), serverArgs(dataDir)...)
	waitFor(t, 30*time.Second, "the first server ready", func() bool { return strings.Contains(first.stderr.String(), "drover server ready") })
	second := start(t, cleanEnv(), serverArgs(dataDir)...)
	// It used to wait forever; the bound only guards against that.
	if code := second.wait(t, 60*time.Second); code != 2 {
		t.Fatalf("second server: exit %d, want 2; stderr:\n%s", code, second.stderr.String())
	}
	want := "data dir " + dataDir + " is in use by another drover server (pid " + strconv.Itoa(first.cmd.Process.Pid) + ")"
	if !strings.Contains(second.stderr.String(), want) {
		t.Fatalf("second server said:\n%s\nwant %q", second.stderr.String(), want)
	}
	// The first one is unharmed, and once it is gone the dir is free.
	_ = first.cmd.Process.Signal(syscall.SIGTERM)
	if code := first.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("first server: exit %d", code)
	}
	third := start(t, cleanEnv(), serverArgs(dataDir)...)
	waitFor(t, 30*time.Second, "a server on the freed dir", func() bool { return strings.Contains(third.stderr.String(), "drover server ready") })
}

// TestServerStopsWhileStarting: a server waiting to open its database (held
// here by another process's lock on etcd's database file, as a stuck etcd
// would) stops on SIGTERM within seconds.
func TestServerStopsWhileStarting(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	p := start(t, cleanEnv(), serverArgs(dataDir)...)
	waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t, 20*time.Second)
	db, err := os.OpenFile(filepath.Join(dataDir, "member", "snap", "db"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := syscall.Flock(int(db.Fd()), syscall.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		p = start(t, cleanEnv(), serverArgs(dataDir)...)
		waitFor(t, 10*time.Second, "the loading line", func() bool { return strings.Contains(p.stderr.String(), "loading its data dir") })
		time.Sleep(500 * time.Millisecond) // now in etcd's wait for its database
		_ = p.cmd.Process.Signal(sig)
		if code := p.wait(t, 60*time.Second); code != 1 || !strings.Contains(p.stderr.String(), "stopped by a signal while starting") {
			t.Fatalf("after %s while starting: exit %d; stderr:\n%s", sig, code, p.stderr.String())
		}
	}
}

// TestServerStartErrors: each cause gets its own hint, no etcd log line,
// and exit 2.
func TestServerStartErrors(t *testing.T) {
	dir := t.TempDir()
	p := start(t, cleanEnv(), serverArgs(filepath.Join(dir, "a"))...)
	waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	listen := p.stderr.String()[strings.Index(p.stderr.String(), "endpoints=")+len("endpoints="):]
	listen = strings.Fields(listen)[0]
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"port in use", []string{"server", "--data-dir", filepath.Join(dir, "b"), "--etcd-listen", "http://" + listen, "--etcd-peer-listen", "http://" + etcdtest.FreeAddr()},
			"another drover server or etcd listens on http://" + listen},
		{"not a directory", serverArgs(filepath.Join(file, "data")), "a part of that path is a file, not a directory"},
	} {
		r := drover(t, tc.args...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, `"level"`) || strings.Contains(r.stderr, "stacktrace") {
			t.Fatalf("%s: exit %d; stderr:\n%s", tc.name, r.code, r.stderr)
		}
	}
	if os.Geteuid() != 0 { // root may write anywhere
		ro := filepath.Join(dir, "ro")
		if err := os.Mkdir(ro, 0o500); err != nil {
			t.Fatal(err)
		}
		if r := drover(t, serverArgs(filepath.Join(ro, "data"))...); r.code != 2 || !strings.Contains(r.stderr, "cannot be written by this user") {
			t.Fatalf("permission denied: exit %d; stderr:\n%s", r.code, r.stderr)
		}
	}
}

// TestUnknownSubcommands: every command group refuses an argument that is
// none of its subcommands with exit 2, suggesting the nearest; it used to
// print its help and exit 0. An unknown command of the root, and a command
// given the wrong number of arguments, exit 2 too (they exited 1).
func TestUnknownSubcommands(t *testing.T) {
	var groups [][]string
	var walk func(c *cobra.Command, path []string)
	walk = func(c *cobra.Command, path []string) {
		if c.HasSubCommands() && len(path) > 0 {
			groups = append(groups, path)
		}
		for _, s := range c.Commands() {
			if s.Name() != "help" && s.Name() != "completion" {
				walk(s, append(append([]string(nil), path...), s.Name()))
			}
		}
	}
	walk(cli.CommandTree(), nil)
	if len(groups) < 8 {
		t.Fatalf("found only %d command groups: %v", len(groups), groups)
	}
	for _, g := range groups {
		r := drover(t, append(g, "bogus")...)
		if r.code != 2 || !strings.Contains(r.stderr, `unknown command "bogus" for "drover `+strings.Join(g, " ")+`"`) {
			t.Fatalf("drover %s bogus: exit %d, stderr %q", strings.Join(g, " "), r.code, r.stderr)
		}
	}
	if r := drover(t, "lock", "lsit"); r.code != 2 || !strings.Contains(r.stderr, "Did you mean this?\n\tlist") {
		t.Fatalf("drover lock lsit: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := drover(t, "bogus"); r.code != 2 || !strings.Contains(r.stderr, `unknown command "bogus" for "drover"`) {
		t.Fatalf("drover bogus: exit %d, stderr %q", r.code, r.stderr)
	}
	for _, args := range [][]string{{"tasks", "get"}, {"lock", "status"}, {"queues", "delete"}} {
		if r := drover(t, args...); r.code != 2 || !strings.Contains(r.stderr, "see 'drover "+strings.Join(args, " ")+" --help'") {
			t.Fatalf("drover %v without its argument: exit %d, stderr %q", args, r.code, r.stderr)
		}
	}
	if r := drover(t, "lock"); r.code != 0 || !strings.Contains(r.stdout, "Available Commands") {
		t.Fatalf("drover lock: exit %d, %q", r.code, r.stdout)
	}
	if r, v := drover(t, "--version"), drover(t, "version"); r.code != 0 || r.stdout != v.stdout || !strings.HasPrefix(r.stdout, "drover ") {
		t.Fatalf("drover --version: exit %d, %q; drover version: %q", r.code, r.stdout, v.stdout)
	}
}
