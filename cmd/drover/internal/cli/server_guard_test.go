package cli_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	root "github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestServerWaterMarkFlags: bad --high-water, --low-water and
// --quota-backend-bytes values exit 2 naming the flag, before anything
// starts, with an external etcd too (whose quota is its own: the flag
// is refused); the help shows an example.
func TestServerWaterMarkFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--high-water", "120%"}, `invalid --high-water "120%": must be above 0% and below 100%`},
		{[]string{"--high-water", "100%"}, `invalid --high-water "100%"`},
		{[]string{"--high-water", "abc"}, `for "--high-water" flag: must be a percent such as 70% or a fraction such as 0.7`},
		{[]string{"--high-water", "70"}, `a fraction must be below 1: write a percent with its sign (70%)`},
		{[]string{"--low-water", "80%"}, `invalid --low-water "80%": must be above 0% and below --high-water (70%)`},
		{[]string{"--high-water", "0.5", "--low-water", "0.5"}, `invalid --low-water "50%": must be above 0% and below --high-water (50%)`},
		{[]string{"--low-water", "0"}, `invalid --low-water "0%"`},
		{[]string{"--low-water", "-10%"}, `invalid --low-water "-10%"`},
		{[]string{"--quota-backend-bytes", "1000"}, `invalid --quota-backend-bytes 1000: must be at least 16777216 (16 MiB)`},
	} {
		dir := t.TempDir()
		r := drover(t, append(serverArgs(filepath.Join(dir, "data")), tc.args...)...)
		if r.code != cli.ExitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Fatalf("server %v: exit %d, stderr %q; want exit 2 saying %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	r := drover(t, "server", "--etcd-endpoints", etcdtest.FreeAddr(), "--quota-backend-bytes", fmt.Sprint(64<<20))
	if r.code != cli.ExitUsage || !strings.Contains(r.stderr, "--quota-backend-bytes has no effect with --etcd-endpoints") {
		t.Fatalf("--quota-backend-bytes with --etcd-endpoints: exit %d, stderr %q", r.code, r.stderr)
	}
	r = drover(t, "server", "--etcd-endpoints", etcdtest.FreeAddr(), "--high-water", "120%")
	if r.code != cli.ExitUsage || !strings.Contains(r.stderr, `invalid --high-water "120%"`) {
		t.Fatalf("a bad --high-water with --etcd-endpoints: exit %d, stderr %q", r.code, r.stderr)
	}
	r = drover(t, "server", "--help")
	for _, want := range []string{"--high-water 80% --low-water 70%", "--high-water percent", "(default 70%)", "(default 60%)", "--quota-backend-bytes int"} {
		if r.code != 0 || !strings.Contains(r.stdout, want) {
			t.Fatalf("server --help does not show %q:\n%s", want, r.stdout)
		}
	}
}

// TestStoreFullExitsBusy: an error matching drover.ErrStoreFull, however
// wrapped, exits 75, as a full queue does.
func TestStoreFullExitsBusy(t *testing.T) {
	full := &root.StoreFullError{Usage: 3 << 30, Quota: 4 << 30, HighWater: 0.7, LowWater: 0.6}
	for _, err := range []error{full, root.ErrStoreFull, fmt.Errorf("queue: submit to emails: %w", full)} {
		if got := cli.ExitCode(err); got != cli.ExitBusy {
			t.Fatalf("exit code of %v: %d, want %d", err, got, cli.ExitBusy)
		}
	}
	if got := cli.ExitCode(fmt.Errorf("other")); got != cli.ExitFailure {
		t.Fatalf("exit code of another error: %d", got)
	}
}

// TestServerGuardsItsNamespace: a server with a 32 MiB quota and a 50 %
// high-water mark writes its namespace's guard key once filled past it, and
// logs it with usage and quota.
func TestServerGuardsItsNamespace(t *testing.T) {
	ns := etcdtest.Namespace(t)
	args := append(serverArgs(filepath.Join(t.TempDir(), "data")), "--namespace", ns,
		"--quota-backend-bytes", fmt.Sprint(32<<20), "--high-water", "50%", "--low-water", "0.4")
	p := start(t, cleanEnv(), args...)
	waitFor(t, 30*time.Second, "the server ready", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	if !strings.Contains(p.stderr.String(), "quota_mib=32 high_water=50% low_water=40%") {
		t.Fatalf("the ready line does not name the quota and marks:\n%s", p.stderr.String())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := connectTo(ctx, t, readyEndpoint(p))
	keys := keyspace.MustNew(ns)
	big := strings.Repeat("x", 1<<20)
	for i := 0; i < 20; i++ { // 20 MiB: past 50 % of 32 MiB, under the quota
		if _, err := c.Put(ctx, fmt.Sprintf("%sfiller/%d", keys.Root(), i), big); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the store-full warning", func() bool {
		return strings.Contains(p.stderr.String(), "past the high-water mark")
	})
	if g, err := c.Get(ctx, keys.StoreFull()); err != nil || len(g.Kvs) != 1 {
		t.Fatalf("guard key of %s: %v, %v", ns, g, err)
	}
	if !strings.Contains(p.stderr.String(), "quota_mib=32") {
		t.Fatalf("the warning does not name the quota:\n%s", p.stderr.String())
	}
	if _, err := c.Delete(ctx, keys.Root()+"filler/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 25*time.Second, "the guard clears the key", func() bool {
		return strings.Contains(p.stderr.String(), "accepted again")
	})
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("server: exit %d; stderr:\n%s", code, p.stderr.String())
	}
}

// readyEndpoint is the first etcd endpoint of the embedded server p's ready
// line.
func readyEndpoint(p *process) string {
	out := p.stderr.String()
	return strings.Fields(out[strings.Index(out, "endpoints=")+len("endpoints="):])[0]
}

// connectTo is an etcd client of endpoint, closed when the test ends.
func connectTo(ctx context.Context, t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	c, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: []string{endpoint}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
