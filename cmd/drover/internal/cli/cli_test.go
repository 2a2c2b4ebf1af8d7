package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/servicetest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestHelpListsCommands(t *testing.T) {
	r := drover(t, "--help")
	if r.code != 0 {
		t.Fatalf("exit %d", r.code)
	}
	for _, want := range []string{"server", "lock", "version", "Run commands under distributed locks", "--etcd-endpoints", "Examples:"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("drover --help lacks %q:\n%s", want, r.stdout)
		}
	}
	for _, cmd := range [][]string{{"server"}, {"lock"}, {"lock", "run"}, {"lock", "status"}, {"lock", "list"}, {"version"},
		{"registry"}, {"registry", "register"}, {"registry", "list"}, {"registry", "watch"}, {"workers"}, {"worker"},
		{"limits"}, {"limits", "set"}, {"limits", "list"}, {"quotas"}, {"quotas", "set"}, {"quotas", "list"},
		{"breakers"}, {"breakers", "list"}, {"breakers", "reset"}, {"queues"}, {"queues", "set"}, {"queues", "get"},
		{"budgets"}, {"budgets", "set"}, {"budgets", "get"}, {"budgets", "list"}, {"budgets", "delete"}} {
		r := drover(t, append(cmd, "--help")...)
		if r.code != 0 || !strings.Contains(r.stdout, "Examples:") {
			t.Errorf("drover %s --help: exit %d, no example:\n%s", strings.Join(cmd, " "), r.code, r.stdout)
		}
	}
}

func TestVersion(t *testing.T) {
	r := drover(t, "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "drover ") || !strings.Contains(r.stdout, "commit ") {
		t.Fatalf("drover version: exit %d, %q", r.code, r.stdout)
	}
	r = drover(t, "version", "--json")
	var v struct{ Version, Commit string }
	if err := json.Unmarshal([]byte(r.stdout), &v); err != nil || v.Version == "" || v.Commit == "" {
		t.Fatalf("drover version --json: %q (%v)", r.stdout, err)
	}
}

func TestServerKeepsDataAndStopsCleanly(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "data")
	client := "http://" + etcdtest.FreeAddr()
	args := []string{"server", "--data-dir", dataDir, "--etcd-listen", client, "--etcd-peer-listen", "http://" + etcdtest.FreeAddr()}

	for i, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		// The ready line says how many cores Go schedules the server over: $GOMAXPROCS when set.
		p := start(t, cleanEnv("GOMAXPROCS="+[]string{"1", "2"}[i]), args...)
		waitFor(t, 30*time.Second, "the ready line", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
		if want := "gomaxprocs=" + []string{"1", "2"}[i]; !strings.Contains(p.stderr.String(), want) {
			t.Fatalf("the ready line does not say %s:\n%s", want, p.stderr.String())
		}
		if n := strings.Count(p.stderr.String(), "\n"); n != 2 || !strings.Contains(p.stderr.String(), []string{"drover server starting", "drover server loading its data dir"}[i]) {
			t.Fatalf("want exactly two lines, starting (or loading) and ready, got %d:\n%s", n, p.stderr.String())
		}
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{client}, DialTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		if i == 0 {
			if _, err := cli.Put(ctx, "/kept", "across restarts"); err != nil {
				t.Fatal(err)
			}
		} else {
			g, err := cli.Get(ctx, "/kept")
			if err != nil || len(g.Kvs) != 1 || string(g.Kvs[0].Value) != "across restarts" {
				t.Fatalf("after a restart /kept = %v (%v)", g, err)
			}
		}
		cancel()
		_ = cli.Close()
		if err := p.cmd.Process.Signal(sig); err != nil {
			t.Fatal(err)
		}
		if code := p.wait(t, 20*time.Second); code != 0 {
			t.Fatalf("server exit %d after %s; stderr:\n%s", code, sig, p.stderr.String())
		}
		if !strings.Contains(p.stderr.String(), "drover server stopped") || strings.Contains(p.stderr.String(), `"level":"error"`) {
			t.Fatalf("unclean stop after %s:\n%s", sig, p.stderr.String())
		}
	}
}

func TestServerAgainstExistingCluster(t *testing.T) {
	dir := t.TempDir()
	p := startIn(t, dir, cleanEnv(), "server", "--etcd-endpoints", strings.Join(srv.Endpoints(), ","))
	waitFor(t, 20*time.Second, "the ready line", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	if !strings.Contains(p.stderr.String(), "etcd=external") {
		t.Fatalf("ready line does not say external:\n%s", p.stderr.String())
	}
	if _, err := os.Stat(filepath.Join(dir, "drover-data")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("external mode created a data dir: %v", err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
}

func TestUnreachableEtcd(t *testing.T) {
	addr := etcdtest.FreeAddr()
	r := drover(t, "lock", "status", "x", "--etcd-endpoints", addr, "--dial-timeout", "1s")
	if r.code != 69 || !strings.Contains(r.stderr, addr) || !strings.Contains(r.stderr, "start `drover server` or set ETCD_ENDPOINTS") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	// ETCD_ENDPOINTS is used when no flag is given.
	p := start(t, cleanEnv("ETCD_ENDPOINTS="+addr), "lock", "list", "--dial-timeout", "1s")
	if code := p.wait(t, 20*time.Second); code != 69 || !strings.Contains(p.stderr.String(), addr) {
		t.Fatalf("with ETCD_ENDPOINTS: exit %d, stderr %q", code, p.stderr.String())
	}
}

func TestLockRunPassesExitCodeAndEnvironment(t *testing.T) {
	ns := etcdtest.Namespace(t)
	r := drover(t, append(etcdFlags(ns), "lock", "run", "job", "--", "sh", "-c", `echo "$DROVER_LOCK_NAME $DROVER_LOCK_TOKEN"; exit 7`)...)
	if r.code != 7 {
		t.Fatalf("exit %d, want CMD's 7; stderr %q", r.code, r.stderr)
	}
	fields := strings.Fields(r.stdout)
	if len(fields) != 2 || fields[0] != "job" {
		t.Fatalf("CMD saw %q, want the lock name and token", r.stdout)
	}
	if tok, err := strconv.ParseInt(fields[1], 10, 64); err != nil || tok <= 0 {
		t.Fatalf("token %q is not a positive number", fields[1])
	}
	if st := lockStatus(t, ns, "job"); st.Held {
		t.Fatalf("lock still held after CMD ended: %+v", st)
	}
	if r := drover(t, append(etcdFlags(ns), "lock", "run", "job", "--", "true")...); r.code != 0 {
		t.Fatalf("true: exit %d", r.code)
	}
	if r := drover(t, append(etcdFlags(ns), "lock", "run", "job", "--", "/no/such/program")...); r.code != 127 {
		t.Fatalf("missing program: exit %d, want 127", r.code)
	}
}

func TestLockRunBusy(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	locker, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns, TTL: 10 * time.Second, HolderID: "busy-worker"})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	if _, err := locker.Acquire(context.Background(), "job"); err != nil {
		t.Fatal(err)
	}
	r := drover(t, append(etcdFlags(ns), "lock", "run", "job", "--wait", "0", "--", "sh", "-c", "echo ran")...)
	if r.code != 75 || !strings.Contains(r.stderr, "busy-worker") || strings.Contains(r.stdout, "ran") {
		t.Fatalf("--wait 0 on a held lock: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	begin := time.Now()
	r = drover(t, append(etcdFlags(ns), "lock", "run", "job", "--wait", "700ms", "--", "sh", "-c", "echo ran")...)
	if r.code != 75 || !strings.Contains(r.stderr, "waiting up to 700ms") || strings.Contains(r.stdout, "ran") {
		t.Fatalf("--wait 700ms on a held lock: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if took := time.Since(begin); took < 700*time.Millisecond {
		t.Fatalf("gave up after %s, before the wait bound", took)
	}
	if st := lockStatus(t, ns, "job"); st.Waiters != 0 {
		t.Fatalf("a waiter that gave up is still queued: %+v", st)
	}
}

func TestLockRunKillsCommandOnLockLoss(t *testing.T) {
	ns := etcdtest.Namespace(t)
	dir := t.TempDir()
	shPid, sleepPid := filepath.Join(dir, "sh.pid"), filepath.Join(dir, "sleep.pid")
	// Both the shell and its child ignore SIGTERM: only SIGKILL after the
	// grace period stops them.
	script := `trap "" TERM; echo $$ > ` + shPid + `; sleep 60 & echo $! > ` + sleepPid + `; wait`
	p := start(t, cleanEnv(), append(etcdFlags(ns), "lock", "run", "job", "--ttl", "5s", "--grace", "1s", "--", "sh", "-c", script)...)
	pids := make([]int, 2)
	waitFor(t, 20*time.Second, "CMD to start", func() bool {
		for i, f := range []string{shPid, sleepPid} {
			b, err := os.ReadFile(f)
			if err != nil {
				return false
			}
			if pids[i], err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
				return false
			}
		}
		return true
	})
	// Take the lock away: revoke the holder's lease, as etcd does when it
	// expires.
	cli := srv.Client(t)
	g, err := cli.Get(context.Background(), keyspace.MustNew(ns).Lock("job"), clientv3.WithPrefix())
	if err != nil || len(g.Kvs) != 1 {
		t.Fatalf("holder key: %v %v", g, err)
	}
	lost := time.Now()
	if _, err := cli.Revoke(context.Background(), clientv3.LeaseID(g.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 60*time.Second); code != 70 {
		t.Fatalf("exit %d after losing the lock, want 70; stderr:\n%s", code, p.stderr.String())
	}
	took := time.Since(lost)
	if !strings.Contains(p.stderr.String(), "lost") || !strings.Contains(p.stderr.String(), "SIGKILL after 1s") {
		t.Fatalf("stderr does not say the lock was lost:\n%s", p.stderr.String())
	}
	for _, pid := range pids {
		if proc.Alive(pid) {
			t.Fatalf("process %d of CMD survived the lock loss", pid)
		}
	}
	// The grace is a lower bound load cannot break; how long after it the
	// kill lands depends on the machine, so only the wait above bounds it.
	if took < time.Second {
		t.Fatalf("CMD stopped %s after the loss; want SIGKILL after the 1s grace", took)
	}
}

func TestLockRunForwardsSignals(t *testing.T) {
	ns := etcdtest.Namespace(t)
	script := `trap 'echo got-term; exit 42' TERM; echo ready; while true; do sleep 0.05; done`
	p := start(t, cleanEnv(), append(etcdFlags(ns), "lock", "run", "job", "--", "sh", "-c", script)...)
	waitFor(t, 20*time.Second, "CMD to start", func() bool { return strings.Contains(p.stdout.String(), "ready") })
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 10*time.Second); code != 42 {
		t.Fatalf("exit %d, want CMD's 42; stderr %q", code, p.stderr.String())
	}
	if !strings.Contains(p.stdout.String(), "got-term") {
		t.Fatalf("CMD did not get SIGTERM: %q", p.stdout.String())
	}
	if st := lockStatus(t, ns, "job"); st.Held {
		t.Fatalf("lock held after CMD ended: %+v", st)
	}
}

type statusOut struct {
	Name   string
	Held   bool
	Holder *struct {
		ID         string    `json:"id"`
		Host       string    `json:"host"`
		PID        int       `json:"pid"`
		AcquiredAt time.Time `json:"acquired_at"`
	}
	Token   int64
	TTL     *float64 `json:"ttl_left_seconds"`
	Waiters int
}

func lockStatus(t *testing.T, ns, name string) statusOut {
	t.Helper()
	r := drover(t, append(etcdFlags(ns), "lock", "status", name, "--json")...)
	var st statusOut
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("lock status --json: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	return st
}

func TestLockStatusAndList(t *testing.T) {
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	locker, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns, TTL: 9 * time.Second, HolderID: "reporter"})
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close(context.Background())
	l, err := locker.Acquire(context.Background(), "alpha")
	if err != nil {
		t.Fatal(err)
	}
	st := lockStatus(t, ns, "alpha")
	if !st.Held || st.Holder == nil || st.Holder.ID != "reporter" || st.Holder.PID != os.Getpid() || st.Token != l.Token() ||
		st.TTL == nil || *st.TTL <= 0 || *st.TTL > 9 || st.Holder.AcquiredAt.IsZero() {
		t.Fatalf("status = %+v", st)
	}
	if free := lockStatus(t, ns, "beta"); free.Held || free.Holder != nil {
		t.Fatalf("free lock: %+v", free)
	}
	r := drover(t, append(etcdFlags(ns), "lock", "status", "alpha")...)
	if r.code != 0 || !strings.Contains(r.stdout, "held") || !strings.Contains(r.stdout, "reporter") {
		t.Fatalf("lock status: %q", r.stdout)
	}
	r = drover(t, append(etcdFlags(ns), "lock", "list", "--json")...)
	var list []statusOut
	if err := json.Unmarshal([]byte(r.stdout), &list); err != nil || len(list) != 1 || list[0].Name != "alpha" || list[0].Token != l.Token() {
		t.Fatalf("lock list --json: %q (%v)", r.stdout, err)
	}
	r = drover(t, append(etcdFlags(ns), "lock", "list")...)
	if !strings.Contains(r.stdout, "NAME") || !strings.Contains(r.stdout, "alpha") {
		t.Fatalf("lock list: %q", r.stdout)
	}
	if r := drover(t, append(etcdFlags(etcdtest.Namespace(t)), "lock", "list", "--json")...); strings.TrimSpace(r.stdout) != "[]" {
		t.Fatalf("empty list --json: %q", r.stdout)
	}
}

func TestBadInput(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want []string // in stderr: the flag or argument, and the rule
	}{
		{"empty name", []string{"lock", "run", "", "--", "true"}, []string{"lock name", "1 to 128 characters"}},
		{"oversized name", []string{"lock", "run", strings.Repeat("n", 129), "--", "true"}, []string{"lock name", "1 to 128 characters"}},
		{"slash in name", []string{"lock", "run", "a/b", "--", "true"}, []string{"lock name", `"a/b"`, "letters, digits"}},
		{"space in name", []string{"lock", "status", "a b"}, []string{"lock name", "letters, digits"}},
		{"ttl too short", []string{"lock", "run", "job", "--ttl", "500ms", "--", "true"}, []string{"--ttl", "between 1s and 24h"}},
		{"ttl too long", []string{"lock", "run", "job", "--ttl", "25h", "--", "true"}, []string{"--ttl", "between 1s and 24h"}},
		{"negative wait", []string{"lock", "run", "job", "--wait", "-1s", "--", "true"}, []string{"--wait", "0 (try once) or positive"}},
		{"bad namespace", []string{"lock", "list", "--namespace", "x/y"}, []string{"--namespace", "letters, digits"}},
		{"no command", []string{"lock", "run", "job"}, []string{"command to run after --"}},
		{"unknown flag", []string{"lock", "run", "job", "--bogus", "--", "true"}, []string{"--bogus"}},
		{"bad log format", []string{"lock", "list", "--log-format", "xml"}, []string{"--log-format", "text or json"}},
		{"server listen not an IP URL", []string{"server", "--etcd-listen", "localhost:2379"}, []string{"--etcd-listen", "IP:PORT"}},
		{"server peers off loopback", []string{"server", "--etcd-peer-listen", "http://0.0.0.0:2380"}, []string{"--etcd-peer-listen", "LOOPBACK"}},
		{"server peers on the client port", []string{"server", "--etcd-listen", "http://127.0.0.1:23999", "--etcd-peer-listen", "http://127.0.0.1:23999"}, []string{"--etcd-peer-listen", "a port each"}},
		{"negative compaction retention", []string{"server", "--auto-compaction-retention", "-1h"}, []string{"--auto-compaction-retention", "0 (off) or positive"}},
		{"gc percent too low", []string{"server", "--gc-percent", "10"}, []string{"--gc-percent", "between 50 and 1000"}},
		{"embed flag with an external cluster", []string{"server", "--data-dir", "/tmp/x"}, []string{"--data-dir", "--etcd-endpoints"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ns := etcdtest.Namespace(t)
			args := append([]string{"--etcd-endpoints", strings.Join(srv.Endpoints(), ",")}, tc.args...)
			if tc.args[0] == "server" && tc.name != "embed flag with an external cluster" {
				args = tc.args // an embedded server: no external endpoints
			}
			if !containsFlag(tc.args, "--namespace") {
				args = append([]string{"--namespace", ns}, args...)
			}
			r := drover(t, args...)
			if r.code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Fatalf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if strings.Contains(r.stdout, "true") {
				t.Fatalf("stdout %q", r.stdout)
			}
			g, err := srv.Client(t).Get(context.Background(), keyspace.MustNew(ns).Root(), clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || g.Count != 0 {
				t.Fatalf("bad input wrote %d keys (%v)", g.Count, err)
			}
		})
	}
}

func containsFlag(args []string, flag string) bool {
	for _, a := range args {
		if a == flag {
			return true
		}
	}
	return false
}

func TestLockRunOnRedis(t *testing.T) {
	ns := etcdtest.Namespace(t)
	own := servicetest.Redis(t)
	backend := []string{"--namespace", ns, "lock", "--lock-backend", "redis://" + own + "/0"}
	r := drover(t, append(backend, "run", "job", "--", "sh", "-c", `echo "$DROVER_LOCK_TOKEN"; exit 3`)...)
	if r.code != 3 {
		t.Fatalf("exit %d, want 3; stderr %q", r.code, r.stderr)
	}
	if tok, err := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); err != nil || tok <= 0 {
		t.Fatalf("token %q", r.stdout)
	}
	p := start(t, cleanEnv(), append(backend, "run", "held", "--ttl", "5s", "--", "sleep", "30")...)
	waitFor(t, 10*time.Second, "the lock to be held", func() bool {
		r := drover(t, append(backend, "status", "held", "--json")...)
		return strings.Contains(r.stdout, `"held":true`)
	})
	if r := drover(t, append(backend, "run", "held", "--wait", "0", "--", "true")...); r.code != 75 {
		t.Fatalf("busy lock on redis: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := drover(t, append(backend, "list", "--json")...); !strings.Contains(r.stdout, `"name":"held"`) {
		t.Fatalf("list on redis: %q", r.stdout)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	p.wait(t, 10*time.Second)
	if r := drover(t, "--namespace", ns, "lock", "--lock-backend", "mysql://x", "list"); r.code != 2 || !strings.Contains(r.stderr, "--lock-backend") {
		t.Fatalf("bad backend: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "--namespace", ns, "--dial-timeout", "1s", "lock", "--lock-backend", "redis://127.0.0.1:1/0", "list"); r.code != 69 || !strings.Contains(r.stderr, "cannot reach redis") {
		t.Fatalf("unreachable redis: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "--namespace", ns, "lock", "--lock-backend", "redlock://127.0.0.1:6379,127.0.0.1:6380", "list"); r.code != 2 || !strings.Contains(r.stderr, "odd number") {
		t.Fatalf("redlock with two servers: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "--namespace", ns, "--dial-timeout", "500ms", "lock", "--lock-backend", "redlock://127.0.0.1:1,127.0.0.1:2,"+own, "list"); r.code != 69 || !strings.Contains(r.stderr, "needs a majority") {
		t.Fatalf("redlock without a majority: exit %d, %q", r.code, r.stderr)
	}
}
