package cli_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// paxosNodes is a group of drover paxos serve processes on loopback, over
// the direct transport.
type paxosNodes struct {
	addrs []string
	dirs  []string
	procs []*process
}

// endpoints is the group's API addresses, comma-separated.
func (g *paxosNodes) endpoints() string { return strings.Join(g.addrs, ",") }

// peers is the --peers value of the group.
func (g *paxosNodes) peers() string {
	var ps []string
	for i, a := range g.addrs {
		ps = append(ps, fmt.Sprintf("%d=%s", i, a))
	}
	return strings.Join(ps, ",")
}

// startPaxosNodes starts n nodes over the direct transport.
func startPaxosNodes(t *testing.T, n int) *paxosNodes {
	t.Helper()
	return startPaxosNodesWith(t, n, []string{"--transport", "direct"})
}

// startPaxosNodesWith starts n nodes with extra arguments and environment;
// node n-1 takes its id from $HOSTNAME, as in a StatefulSet. It waits
// until a leader is known.
func startPaxosNodesWith(t *testing.T, n int, extra []string, env ...string) *paxosNodes {
	t.Helper()
	g := &paxosNodes{}
	for i := 0; i < n; i++ {
		g.addrs = append(g.addrs, etcdtest.FreeAddr())
		g.dirs = append(g.dirs, filepath.Join(t.TempDir(), fmt.Sprintf("node-%d", i)))
	}
	for i := 0; i < n; i++ {
		args := append([]string{"paxos", "serve", "--peers", g.peers(), "--data-dir", g.dirs[i], "--request-timeout", "3s"}, extra...)
		nodeEnv := cleanEnv(append(env, "HOSTNAME=lock-service-"+strconv.Itoa(i))...)
		if i < n-1 {
			args = append(args, "--id", strconv.Itoa(i))
			nodeEnv = cleanEnv(env...)
		}
		g.procs = append(g.procs, start(t, nodeEnv, args...))
	}
	waitFor(t, 15*time.Second, "a leader", func() bool {
		r := drover(t, "paxos", "status", "--endpoints", g.endpoints(), "--json")
		return strings.Contains(r.stdout, `"has_leader":true`)
	})
	return g
}

// stop sends SIGTERM to node i and checks it exits 0.
func (g *paxosNodes) stop(t *testing.T, i int) {
	t.Helper()
	_ = g.procs[i].cmd.Process.Signal(syscall.SIGTERM)
	if code := g.procs[i].wait(t, 20*time.Second); code != 0 {
		t.Fatalf("node %d after SIGTERM: exit %d; stderr:\n%s", i, code, g.procs[i].stderr.String())
	}
}

// TestPaxosGroupCLI runs a three-node group of the real binary and uses it
// the way an operator and drover's lock commands do.
func TestPaxosGroupCLI(t *testing.T) {
	g := startPaxosNodes(t, 3)
	t.Run("status", func(t *testing.T) {
		r := drover(t, "paxos", "status", "--endpoints", g.endpoints())
		if r.code != 0 || !regexp.MustCompile(`(?m)^leader: node \d`).MatchString(r.stdout) || strings.Count(r.stdout, "127.0.0.1:") < 3 {
			t.Fatalf("status: exit %d\n%s%s", r.code, r.stdout, r.stderr)
		}
		var st struct {
			HasLeader bool `json:"has_leader"`
			Nodes     []struct {
				ID    *int    `json:"id"`
				Role  string  `json:"role"`
				Lag   *uint64 `json:"lag"`
				Error string  `json:"error"`
			} `json:"nodes"`
		}
		r = drover(t, "paxos", "status", "--endpoints", g.endpoints(), "--json")
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || !st.HasLeader || len(st.Nodes) != 3 {
			t.Fatalf("status --json: %v %q", err, r.stdout)
		}
		for i, n := range st.Nodes {
			if n.ID == nil || *n.ID != i || n.Error != "" || n.Lag == nil {
				t.Fatalf("node %d: %+v in %s", i, n, r.stdout)
			}
		}
	})
	backend := []string{"lock", "--lock-backend", "paxos://" + g.endpoints()}
	t.Run("lock run", func(t *testing.T) {
		r := drover(t, append(backend, "run", "job", "--", "sh", "-c", `echo "$DROVER_LOCK_TOKEN"; exit 3`)...)
		if tok, err := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); r.code != 3 || err != nil || tok <= 0 {
			t.Fatalf("lock run: exit %d, token %q, stderr %q", r.code, r.stdout, r.stderr)
		}
		p := start(t, cleanEnv(), append(backend, "run", "held", "--ttl", "5s", "--", "sleep", "30")...)
		waitFor(t, 10*time.Second, "the lock to be held", func() bool {
			return strings.Contains(drover(t, append(backend, "status", "held", "--json")...).stdout, `"held":true`)
		})
		r = drover(t, append(backend, "status", "held", "--json")...)
		if !strings.Contains(r.stdout, fmt.Sprintf(`"pid":%d`, p.cmd.Process.Pid)) {
			t.Fatalf("status of a held lock does not show the holder's pid %d: %s", p.cmd.Process.Pid, r.stdout)
		}
		if r := drover(t, append(backend, "run", "held", "--wait", "0", "--", "true")...); r.code != 75 {
			t.Fatalf("busy lock: exit %d, stderr %q", r.code, r.stderr)
		}
		if r := drover(t, append(backend, "list", "--json")...); !strings.Contains(r.stdout, `"name":"held"`) {
			t.Fatalf("list: %q", r.stdout)
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		p.wait(t, 10*time.Second)
		if r := drover(t, append(backend, "status", "held", "--json")...); !strings.Contains(r.stdout, `"held":false`) {
			t.Fatalf("the lock is still held after its holder stopped: %q", r.stdout)
		}
	})
	t.Run("fenced checkpoints", func(t *testing.T) {
		r := drover(t, "demo", "lost-update", "--json", "--workers", "3", "--invocations", "10", "--max-delay", "10ms",
			"--protect", "lock", "--lock-backend", "paxos://"+g.endpoints())
		var res struct{ Expected, Actual, Lost int }
		if err := json.Unmarshal([]byte(r.stdout), &res); r.code != 0 || err != nil || res.Expected != 30 || res.Actual != 30 {
			t.Fatalf("lost-update on paxos: exit %d, %q, %q", r.code, r.stdout, r.stderr)
		}
	})
	t.Run("members", func(t *testing.T) { paxosMembership(t, g) })
	t.Run("one node down", func(t *testing.T) {
		g.stop(t, 0)
		r := drover(t, "paxos", "status", "--endpoints", g.endpoints())
		if r.code != 0 || !strings.Contains(r.stdout, "unreachable") {
			t.Fatalf("status with a node down: exit %d\n%s", r.code, r.stdout)
		}
		if r := drover(t, append(backend, "run", "still", "--", "true")...); r.code != 0 {
			t.Fatalf("lock run with two of three nodes: exit %d, %q", r.code, r.stderr)
		}
	})
	g.stop(t, 1)
	g.stop(t, 2)
}

// TestPaxosGroupOverRabbitMQ runs a three-node group over the RabbitMQ on
// 127.0.0.1:5672 (or $DROVER_RABBITMQ_URL), configured as the seed's
// deployment does: RABBITMQ_URL and HOSTNAME in the environment.
func TestPaxosGroupOverRabbitMQ(t *testing.T) {
	url := os.Getenv("DROVER_RABBITMQ_URL")
	if url == "" {
		url = "amqp://guest:guest@127.0.0.1:5672/"
	}
	if u, err := neturl.Parse(url); err != nil {
		t.Fatal(err)
	} else if c, err := net.DialTimeout("tcp", u.Host, 2*time.Second); err != nil {
		if os.Getenv("DROVER_REQUIRE_SERVICES") == "1" {
			t.Fatalf("RabbitMQ not available: %v", err)
		}
		t.Skipf("RabbitMQ not available: %v", err)
	} else {
		_ = c.Close()
	}
	group := fmt.Sprintf("cli-test-%d", time.Now().UnixNano())
	g := startPaxosNodesWith(t, 3, []string{"--group", group}, "RABBITMQ_URL="+url)
	backend := []string{"lock", "--lock-backend", "paxos://" + g.endpoints()}
	for i := 0; i < 3; i++ {
		r := drover(t, append(backend, "run", "over-rabbitmq", "--", "sh", "-c", `echo "$DROVER_LOCK_TOKEN"`)...)
		if tok, err := strconv.ParseInt(strings.TrimSpace(r.stdout), 10, 64); r.code != 0 || err != nil || tok <= 0 {
			t.Fatalf("lock run over RabbitMQ: exit %d, token %q, stderr %q", r.code, r.stdout, r.stderr)
		}
	}
	if r := drover(t, "paxos", "status", "--endpoints", g.endpoints()); r.code != 0 || !strings.Contains(r.stdout, "leader: node") {
		t.Fatalf("status: exit %d, %q", r.code, r.stdout)
	}
	for i := range g.procs {
		g.stop(t, i)
	}
}

// paxosMembership grows the group by a fourth node and shrinks it back.
func paxosMembership(t *testing.T, g *paxosNodes) {
	addr, dir := etcdtest.FreeAddr(), filepath.Join(t.TempDir(), "node-3")
	p := start(t, cleanEnv(), "paxos", "serve", "--join", "--id", "3", "--listen", addr, "--peers", g.peers(), "--transport", "direct", "--data-dir", dir)
	r := drover(t, "paxos", "members", "add", "--id", "3", "--addr", addr, "--endpoints", g.endpoints())
	if r.code != 0 || !strings.Contains(r.stdout, "node 3 added") {
		t.Fatalf("members add: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	all := g.endpoints() + "," + addr
	waitFor(t, 15*time.Second, "node 3 to catch up", func() bool {
		r := drover(t, "paxos", "status", "--endpoints", all, "--json")
		return regexp.MustCompile(`"id":3,"role":"follower"[^}]*"lag":0`).MatchString(r.stdout)
	})
	r = drover(t, "paxos", "members", "remove", "--id", "3", "--endpoints", g.endpoints())
	if r.code != 0 || !strings.Contains(r.stdout, "node 3 removed") {
		t.Fatalf("members remove: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("removed node after SIGTERM: exit %d: %s", code, p.stderr.String())
	}
	if r := drover(t, "paxos", "members", "add", "--endpoints", g.endpoints()); r.code != 2 || !strings.Contains(r.stderr, "--id") {
		t.Fatalf("members add without --id: exit %d, %q", r.code, r.stderr)
	}
}

// TestPaxosServeRefusesBadInput checks that each bad flag exits 2 naming
// the flag, and an unreachable broker exits 69 without the password, all
// before anything is written.
func TestPaxosServeRefusesBadInput(t *testing.T) {
	const peers = "0=127.0.0.1:7100,1=127.0.0.1:7101,2=127.0.0.1:7102"
	dir := filepath.Join(t.TempDir(), "data")
	base := []string{"paxos", "serve", "--data-dir", dir, "--transport", "direct"}
	cases := []struct {
		name string
		env  []string
		args []string
		want []string
	}{
		{"no peers", nil, []string{"--id", "0"}, []string{"--peers", "required"}},
		{"bad member", nil, []string{"--id", "0", "--peers", "x=1"}, []string{"--peers", "node id"}},
		{"repeated id", nil, []string{"--id", "0", "--peers", "0=127.0.0.1:1,0=127.0.0.1:2"}, []string{"--peers", "repeats"}},
		{"id not a member", nil, []string{"--id", "5", "--peers", peers}, []string{"--id", "--join"}},
		{"hostname without ordinal", []string{"HOSTNAME=web"}, []string{"--peers", peers}, []string{"--id", `"web"`}},
		{"ordinals of host names", []string{"HOSTNAME=lock-service-7"}, []string{"--peers", "lock-service-0.svc:3000,lock-service-1.svc:3000"}, []string{"--id", "7", "must be one of the members"}},
		{"join as a member", nil, []string{"--id", "0", "--join", "--peers", peers}, []string{"--peers", "--join"}},
		{"bad transport", nil, []string{"--id", "0", "--peers", peers, "--transport", "redis://x:1"}, []string{"--transport"}},
		{"direct without addresses", nil, []string{"--id", "0", "--peers", "0,1,2", "--listen", "127.0.0.1:1"}, []string{"--peers", "no address"}},
		{"bad listen", nil, []string{"--id", "0", "--peers", peers, "--listen", "nowhere"}, []string{"--listen"}},
		{"no data dir", nil, []string{"--id", "0", "--peers", peers, "--data-dir", ""}, []string{"--data-dir"}},
		{"negative lock delay", nil, []string{"--id", "0", "--peers", peers, "--lock-delay", "-1s"}, []string{"--lock-delay"}},
		{"zero request timeout", nil, []string{"--id", "0", "--peers", peers, "--request-timeout", "0s"}, []string{"--request-timeout"}},
		{"bad group", nil, []string{"--id", "0", "--peers", peers, "--group", "a.b"}, []string{"--group"}},
		{"unknown flag", nil, []string{"--id", "0", "--peers", peers, "--colour"}, []string{"--colour"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := droverEnv(t, cleanEnv(append([]string{"HOSTNAME=", "RABBITMQ_URL="}, tc.env...)...), append(append([]string{}, base...), tc.args...)...)
			if r.code != 2 {
				t.Fatalf("exit %d, want 2; stderr %q", r.code, r.stderr)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stderr, w) {
					t.Fatalf("stderr %q lacks %q", r.stderr, w)
				}
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Fatalf("the data dir was created (%v)", err)
			}
		})
	}
	t.Run("no transport", func(t *testing.T) {
		r := droverEnv(t, cleanEnv("RABBITMQ_URL="), "paxos", "serve", "--id", "0", "--peers", peers, "--data-dir", dir)
		if r.code != 2 || !strings.Contains(r.stderr, "--transport") || !strings.Contains(r.stderr, "RABBITMQ_URL") {
			t.Fatalf("exit %d, %q", r.code, r.stderr)
		}
	})
	t.Run("unreachable broker", func(t *testing.T) {
		url := "amqp://drover:s3cret@" + etcdtest.FreeAddr() + "/"
		r := droverEnv(t, cleanEnv("RABBITMQ_URL="+url), "--dial-timeout", "2s", "paxos", "serve", "--id", "0", "--peers", "0,1,2",
			"--listen", etcdtest.FreeAddr(), "--data-dir", dir)
		host := strings.TrimSuffix(strings.Split(url, "@")[1], "/")
		if r.code != 69 || strings.Contains(r.stderr, "s3cret") || !strings.Contains(r.stderr, host) {
			t.Fatalf("exit %d, want 69 naming the broker without its password; stderr %q", r.code, r.stderr)
		}
		if _, err := os.Stat(dir); !os.IsNotExist(err) {
			t.Fatalf("the data dir was created (%v)", err)
		}
	})
}

// TestPaxosServeRefusesOtherGroupsDataDir checks a data dir made by one
// group is refused by another, with nothing written to it, and that a port
// in use is a usage error.
func TestPaxosServeRefusesOtherGroupsDataDir(t *testing.T) {
	dir, addr := filepath.Join(t.TempDir(), "data"), etcdtest.FreeAddr()
	args := []string{"paxos", "serve", "--id", "0", "--peers", "0=" + addr, "--transport", "direct", "--data-dir", dir}
	p := start(t, cleanEnv(), append(args, "--group", "alpha")...)
	waitFor(t, 15*time.Second, "the node to answer", func() bool {
		return drover(t, "paxos", "status", "--endpoints", addr).code == 0
	})
	if r := drover(t, append(args, "--group", "beta", "--listen", etcdtest.FreeAddr())...); r.code != 2 || !strings.Contains(r.stderr, "--data-dir") {
		t.Fatalf("a second node on a data dir in use: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, append(args, "--group", "alpha", "--data-dir", t.TempDir())...); r.code != 2 || !strings.Contains(r.stderr, "--listen") {
		t.Fatalf("a port in use: exit %d, %q", r.code, r.stderr)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 20*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM: %s", code, p.stderr.String())
	}
	before := dirContents(t, dir)
	r := drover(t, append(args, "--group", "beta")...)
	if r.code != 2 || !strings.Contains(r.stderr, "--data-dir") || !strings.Contains(r.stderr, "alpha") {
		t.Fatalf("data dir of another group: exit %d, %q", r.code, r.stderr)
	}
	if after := dirContents(t, dir); !bytes.Equal(before, after) {
		t.Fatal("the refused node changed the data dir")
	}
}

// droverEnv runs the binary with env to completion (bounded by 60 s).
func droverEnv(t *testing.T, env []string, args ...string) result {
	t.Helper()
	p := start(t, env, args...)
	p.wait(t, 60*time.Second)
	return result{code: p.code, stdout: p.stdout.String(), stderr: p.stderr.String()}
}

// dirContents is every file of dir, names and bytes, in one slice.
func dirContents(t *testing.T, dir string) []byte {
	t.Helper()
	var out []byte
	err := filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		out = append(append(out, path...), b...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPaxosClientCommandsUnreachable checks the client commands' exit
// codes without a group.
func TestPaxosClientCommandsUnreachable(t *testing.T) {
	dead := etcdtest.FreeAddr()
	if r := drover(t, "paxos", "status", "--endpoints", dead); r.code != 69 || !strings.Contains(r.stdout, "unreachable") {
		t.Fatalf("status of a dead node: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if r := drover(t, "paxos", "status", "--endpoints", "no-port"); r.code != 2 || !strings.Contains(r.stderr, "--endpoints") {
		t.Fatalf("status with a bad endpoint: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "paxos", "members", "remove", "--id", "1", "--endpoints", dead); r.code != 69 {
		t.Fatalf("members remove on a dead node: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "--dial-timeout", "1s", "lock", "--lock-backend", "paxos://"+dead, "list"); r.code != 69 || !strings.Contains(r.stderr, "cannot reach any node") {
		t.Fatalf("lock list on a dead group: exit %d, %q", r.code, r.stderr)
	}
	if r := drover(t, "lock", "--lock-backend", "paxos://", "list"); r.code != 2 || !strings.Contains(r.stderr, "--lock-backend") {
		t.Fatalf("paxos:// without nodes: exit %d, %q", r.code, r.stderr)
	}
	for _, cmd := range [][]string{{"paxos"}, {"paxos", "serve"}, {"paxos", "status"}, {"paxos", "members"}, {"paxos", "members", "add"}, {"paxos", "members", "remove"}} {
		if r := drover(t, append(cmd, "--help")...); r.code != 0 || !strings.Contains(r.stdout, "Examples:") {
			t.Errorf("drover %s --help: exit %d, no example", strings.Join(cmd, " "), r.code)
		}
	}
}

// TestDeployManifestsUseRealFlags checks every flag the Kubernetes
// manifests pass to drover exists, and that the StatefulSet reads
// HOSTNAME and RABBITMQ_URL as the CLI expects.
func TestDeployManifestsUseRealFlags(t *testing.T) {
	// The lock service's manifests; the others (drover server, drover
	// worker) are checked command by command in deploy/.
	files, _ := filepath.Glob("../../../../deploy/k8s/lock-service*.yaml")
	if len(files) == 0 {
		t.Fatal("no manifests in deploy/k8s")
	}
	serve, _, err := cli.CommandTree().Find([]string{"paxos", "serve"})
	if err != nil {
		t.Fatal(err)
	}
	flagRE := regexp.MustCompile(`^\s*- "?--([a-z-]+)`)
	var all string
	seen := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		all += string(b)
		for _, line := range strings.Split(string(b), "\n") {
			if m := flagRE.FindStringSubmatch(line); m != nil {
				seen++
				if serve.Flag(m[1]) == nil {
					t.Errorf("%s passes --%s, which drover paxos serve does not take", filepath.Base(f), m[1])
				}
			}
		}
	}
	if seen < 3 {
		t.Fatalf("found %d flags in the manifests", seen)
	}
	for _, want := range []string{"kind: StatefulSet", "replicas: 3", "name: lock-service-headless", "clusterIP: None", "kind: Secret",
		"name: HOSTNAME", "fieldPath: metadata.name", "name: " + cli.EnvRabbitMQURL, "secretKeyRef:", "volumeClaimTemplates:", "path: /status"} {
		if !strings.Contains(all, want) {
			t.Errorf("manifests lack %q", want)
		}
	}
	df, err := os.ReadFile("../../../../Dockerfile")
	if err != nil || !strings.Contains(string(df), "./cmd/drover") || !strings.Contains(string(df), "USER 65532") {
		t.Fatalf("Dockerfile does not build ./cmd/drover to run as non-root: %v", err)
	}
}
