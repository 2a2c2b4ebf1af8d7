package cli_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// TestServerUnreachableEtcdAdvice: a server pointed at an etcd that does
// not answer says to check that etcd and the endpoints, not to start
// `drover server` (itself); exit 69 as for every unreachable etcd.
func TestServerUnreachableEtcdAdvice(t *testing.T) {
	addr := etcdtest.FreeAddr()
	r := drover(t, "server", "--etcd-endpoints", addr, "--dial-timeout", "1s")
	if r.code != 69 || !strings.Contains(r.stderr, "cannot reach etcd at "+addr) || !strings.Contains(r.stderr, "is etcd running there?") ||
		!strings.Contains(r.stderr, "--etcd-endpoints") || strings.Contains(r.stderr, "start `drover server`") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestRestoreNamesMissingBackup: a backup that is not there is named, not
// its checksum file; a directory is refused as such.
func TestRestoreNamesMissingBackup(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "nope.db")
	r := drover(t, "restore", missing, "--data-dir", filepath.Join(dir, "data"))
	if r.code != 2 || !strings.Contains(r.stderr, "backup "+missing+" does not exist") || strings.Contains(r.stderr, "sha256") {
		t.Fatalf("missing backup: exit %d, stderr %q", r.code, r.stderr)
	}
	r = drover(t, "restore", dir, "--data-dir", filepath.Join(dir, "data"))
	if r.code != 2 || !strings.Contains(r.stderr, "is a directory") {
		t.Fatalf("a directory as backup: exit %d, stderr %q", r.code, r.stderr)
	}
	if _, err := os.Stat(filepath.Join(dir, "data")); !os.IsNotExist(err) {
		t.Fatalf("a failed restore left its data dir: %v", err)
	}
}

// TestFailedServerStartLeavesNothing: a server that cannot listen leaves
// neither the data dir it created nor a drover.lock in a dir that was
// there; a drover.lock left by a process that died does not stop the next
// server.
func TestFailedServerStartLeavesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dir := t.TempDir()
	existing := filepath.Join(dir, "existing")
	if err := os.Mkdir(existing, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, dataDir := range []string{filepath.Join(dir, "new"), existing} {
		r := drover(t, "server", "--data-dir", dataDir, "--etcd-listen", "http://"+ln.Addr().String(), "--etcd-peer-listen", "http://"+etcdtest.FreeAddr())
		if r.code != 2 || !strings.Contains(r.stderr, "address already in use") {
			t.Fatalf("port in use: exit %d; stderr:\n%s", r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "new")); !os.IsNotExist(err) {
		t.Fatalf("the failed server left the data dir it created: %v", err)
	}
	if left, _ := os.ReadDir(existing); len(left) != 0 {
		t.Fatalf("the failed server left %v in the existing data dir", left)
	}

	// A lock file whose process is gone (SIGKILL leaves it) holds nothing.
	dead := start(t, cleanEnv(), "version")
	dead.wait(t, 60*time.Second)
	stale := filepath.Join(dir, "stale")
	if err := os.Mkdir(stale, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stale, "drover.lock"), []byte(strconv.Itoa(dead.cmd.Process.Pid)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := start(t, cleanEnv(), serverArgs(stale)...)
	waitFor(t, 60*time.Second, "a server on the dir with a stale lock file", func() bool {
		return strings.Contains(p.stderr.String(), "drover server ready") || strings.Contains(p.stderr.String(), "drover: ")
	})
	if !strings.Contains(p.stderr.String(), "drover server ready") {
		t.Fatalf("a stale drover.lock stopped the server:\n%s", p.stderr.String())
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 60*time.Second); code != 0 {
		t.Fatalf("server exit %d:\n%s", code, p.stderr.String())
	}
}

// TestNegativeNumberArgument: a negative number where an argument goes is
// read as a flag by the parser; the error names the argument and its rule
// where the command has one (quotas set's K), and otherwise says that it
// was read as a flag and how to pass such an argument, instead of
// "unknown shorthand flag".
func TestNegativeNumberArgument(t *testing.T) {
	ns := etcdtest.Namespace(t)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"quotas", "set", "tenant", "-1"}, `invalid K "-1": must be an integer between 1 and 100000`},
		{[]string{"quotas", "set", "tenant", "--", "-1"}, "K -1: must be between 1 and 100000"},
		{[]string{"limits", "set", "api", "-5/s"}, "-5/s reads as a flag, and drover limits set has no such flag: a number there must not be negative"},
		{[]string{"tasks", "list", "-1"}, "goes after --"},
	} {
		r := drover(t, append(etcdFlags(ns), tc.args...)...)
		if r.code != 2 || !strings.Contains(r.stderr, tc.want) || strings.Contains(r.stderr, "unknown shorthand flag") {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 and %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	if r := drover(t, append(etcdFlags(ns), "quotas", "set", "tenant", "-x")...); r.code != 2 || !strings.Contains(r.stderr, "unknown shorthand flag: 'x'") {
		t.Errorf("an unknown letter flag: exit %d, stderr %q", r.code, r.stderr)
	}
}
