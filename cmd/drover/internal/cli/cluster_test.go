package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
)

// etcdMember is one `drover server` process of a test cluster.
type etcdMember struct {
	name, client, peer, http, dataDir string
	p                                 *process
}

// memberArgs are the server flags of m, a member of the cluster ic (or,
// with join, of the cluster it joins).
func (m *etcdMember) args(ic, join string) []string {
	args := []string{"server", "--name", m.name, "--data-dir", m.dataDir, "--etcd-listen", m.client, "--etcd-peer-listen", m.peer,
		"--http-listen", m.http}
	if join != "" {
		return append(args, "--join", join)
	}
	return append(args, "--initial-cluster", ic)
}

func newMember(t *testing.T, name string) *etcdMember {
	t.Helper()
	return &etcdMember{name: name, client: "http://" + etcdtest.FreeAddr(), peer: "http://" + etcdtest.FreeAddr(),
		http: etcdtest.FreeAddr(), dataDir: filepath.Join(t.TempDir(), name)}
}

func (m *etcdMember) waitReady(t *testing.T) {
	t.Helper()
	waitFor(t, 30*time.Second, m.name+" ready", func() bool {
		if strings.Contains(m.p.stderr.String(), "drover server ready") {
			return true
		}
		select {
		case <-m.p.done:
			t.Fatalf("%s exited %d: %s", m.name, m.p.code, m.p.stderr.String())
		default:
		}
		return false
	})
}

// startMembers starts n `drover server` processes forming one cluster,
// and waits until each is ready.
func startMembers(t *testing.T, n int) []*etcdMember {
	t.Helper()
	ms := make([]*etcdMember, n)
	var ic []string
	for i := range ms {
		ms[i] = newMember(t, fmt.Sprintf("s%d", i+1))
		ic = append(ic, ms[i].name+"="+ms[i].peer)
	}
	for _, m := range ms {
		m.p = start(t, cleanEnv(), m.args(strings.Join(ic, ","), "")...)
	}
	for _, m := range ms {
		m.waitReady(t)
	}
	return ms
}

func clientURLs(ms []*etcdMember) string {
	var eps []string
	for _, m := range ms {
		eps = append(eps, m.client)
	}
	return strings.Join(eps, ",")
}

// statusView is `cluster status --json`, as far as the tests read it.
type statusView struct {
	Leader  string `json:"leader"`
	Members []struct {
		Name      string `json:"name"`
		ID        string `json:"id"`
		Leader    bool   `json:"leader"`
		Learner   bool   `json:"learner"`
		RaftTerm  uint64 `json:"raft_term"`
		RaftIndex uint64 `json:"raft_index"`
		DBSize    int64  `json:"db_size"`
		Error     string `json:"error"`
	} `json:"members"`
}

func clusterStatus(t *testing.T, endpoints string) statusView {
	t.Helper()
	r := drover(t, "--etcd-endpoints", endpoints, "cluster", "status", "--json")
	var v statusView
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("cluster status: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	return v
}

// leaders counts the members that say they lead, and checks that every
// member answered but those in down.
func (v statusView) leaders(t *testing.T, down ...string) int {
	t.Helper()
	n := 0
	for _, m := range v.Members {
		isDown := false
		for _, d := range down {
			isDown = isDown || m.Name == d
		}
		if (m.Error != "") != isDown || (!isDown && (m.RaftTerm == 0 || m.RaftIndex == 0 || m.DBSize == 0 || m.Learner)) {
			t.Fatalf("member %+v (down: %v)", m, down)
		}
		if m.Leader {
			n++
		}
	}
	return n
}

// TestThreeMemberCluster: three `drover server` processes given each
// other as --initial-cluster form one etcd cluster with one leader, each
// serving the HTTP API; a fourth joins with --join and leaves with
// `drover cluster remove`, and its server stops by itself. Then the leader
// is SIGKILLed: a client given every endpoint writes again within 3 s; the
// killed member, restarted with the same flags, rejoins.
func TestThreeMemberCluster(t *testing.T) {
	ms := startMembers(t, 3)
	all := clientURLs(ms)
	v := clusterStatus(t, all)
	if len(v.Members) != 3 || v.leaders(t) != 1 || v.Leader == "" {
		t.Fatalf("status: %+v", v)
	}
	for _, m := range ms {
		resp, err := http.Get("http://" + m.http + "/v1/limits")
		if err != nil {
			t.Fatalf("%s's HTTP API: %v", m.name, err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s's HTTP API: GET /v1/limits: %s", m.name, resp.Status)
		}
	}

	s4 := newMember(t, "s4")
	s4.p = start(t, cleanEnv(), s4.args("", ms[0].client)...)
	s4.waitReady(t)
	if v := clusterStatus(t, all); len(v.Members) != 4 || v.leaders(t) != 1 {
		t.Fatalf("status after s4 joined: %+v", v)
	}
	if r := drover(t, "--etcd-endpoints", all, "cluster", "remove", "s4"); r.code != 0 || !strings.HasPrefix(r.stdout, "removed member s4 (") {
		t.Fatalf("cluster remove s4: exit %d, %q, %q", r.code, r.stdout, r.stderr)
	}
	if code := s4.p.wait(t, 20*time.Second); code != 1 || !strings.Contains(s4.p.stderr.String(), "removed from its cluster") {
		t.Fatalf("removed s4 exited %d: %s", code, s4.p.stderr.String())
	}
	if r := drover(t, "--etcd-endpoints", all, "cluster", "remove", "s4"); r.code != 2 || !strings.Contains(r.stderr, `"s4" names no member`) {
		t.Fatalf("removing s4 twice: exit %d, %q", r.code, r.stderr)
	}
	v = clusterStatus(t, all)
	if len(v.Members) != 3 {
		t.Fatalf("status after s4 left: %+v", v)
	}
	dead := leaderFailover(t, ms, v.Leader)

	// Restarted with the same flags, the member rejoins from its data dir.
	var ic []string
	for _, m := range ms {
		ic = append(ic, m.name+"="+m.peer)
	}
	dead.p = start(t, cleanEnv(), dead.args(strings.Join(ic, ","), "")...)
	dead.waitReady(t)
	if v := clusterStatus(t, all); len(v.Members) != 3 || v.leaders(t) != 1 {
		t.Fatalf("status after %s restarted: %+v", dead.name, v)
	}
}

// leaderFailover SIGKILLs the leader and measures how long a client given
// every endpoint takes to write again. It returns the dead member.
func leaderFailover(t *testing.T, ms []*etcdMember, leader string) *etcdMember {
	t.Helper()
	ctx := context.Background()
	var eps []string
	for _, m := range ms {
		eps = append(eps, strings.TrimPrefix(m.client, "http://"))
	}
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: eps})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	if _, err := cli.Put(ctx, "/failover/before", "x"); err != nil {
		t.Fatal(err)
	}
	var dead *etcdMember
	for _, m := range ms {
		if m.name == leader {
			dead = m
		}
	}
	if err := dead.p.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	for attempt := 0; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
		_, err := cli.Put(actx, "/failover/after", "x")
		cancel()
		if err == nil {
			break
		}
		// Only against a hang: how soon etcd elects a new leader depends
		// on its election timeout and on the machine's load.
		if time.Since(killed) > 60*time.Second {
			t.Fatalf("no write within 60 s of killing the leader %s (%d attempts): %v", leader, attempt, err)
		}
	}
	took := time.Since(killed)
	t.Logf("leader %s SIGKILLed: first write through a client of all 3 endpoints after %s", leader, took.Round(time.Millisecond))
	var alive []*etcdMember
	for _, m := range ms {
		if m != dead {
			alive = append(alive, m)
		}
	}
	v := clusterStatus(t, clientURLs(alive))
	if len(v.Members) != 3 || v.leaders(t, leader) != 1 || v.Leader == leader {
		t.Fatalf("status after the leader died: %+v", v)
	}
	if r := drover(t, "--etcd-endpoints", clientURLs(ms), "lock", "run", "after-failover", "--", "true"); r.code != 0 {
		t.Fatalf("lock run with a dead endpoint among three: exit %d, %q", r.code, r.stderr)
	}
	return dead
}

// TestServerClusterFlags: flags that cannot form a cluster are refused
// before anything starts, naming the flag and the rule.
func TestServerClusterFlags(t *testing.T) {
	dir := t.TempDir()
	p1, p2 := "http://"+etcdtest.FreeAddr(), "http://"+etcdtest.FreeAddr()
	ic := "s1=" + p1 + ",s2=" + p2 + ",s3=http://127.0.0.1:1"
	base := []string{"server", "--data-dir", filepath.Join(dir, "data"), "--etcd-listen", "http://" + etcdtest.FreeAddr()}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"name not in the cluster", []string{"--name", "s9", "--initial-cluster", ic, "--etcd-peer-listen", p1}, `invalid --name "s9": must be one of the names in the initial cluster (s1, s2, s3)`},
		{"peer URL not the cluster's", []string{"--name", "s1", "--initial-cluster", ic, "--etcd-peer-listen", p2}, `invalid --etcd-peer-listen "` + p2 + `": must be s1's peer URL in the initial cluster, ` + p1},
		{"advertised peer not the cluster's", []string{"--name", "s1", "--initial-cluster", ic, "--etcd-peer-listen", "http://0.0.0.0:2380", "--etcd-advertise-peer", p2}, `invalid --etcd-advertise-peer`},
		{"every address, not advertised", []string{"--name", "s1", "--initial-cluster", ic, "--etcd-peer-listen", "http://0.0.0.0:2380"}, `invalid --etcd-advertise-peer: is required when the listener binds every address`},
		{"bad state", []string{"--name", "s1", "--initial-cluster", ic, "--etcd-peer-listen", p1, "--initial-cluster-state", "old"}, `invalid --initial-cluster-state "old": must be new or existing`},
		{"bad initial cluster", []string{"--name", "s1", "--initial-cluster", "s1", "--etcd-peer-listen", p1}, `invalid --initial-cluster "s1"`},
		{"join with an initial cluster", []string{"--name", "s1", "--initial-cluster", ic, "--join", "http://127.0.0.1:1", "--etcd-peer-listen", p1}, `must be empty when joining`},
		{"cluster flag with an external etcd", []string{"--etcd-endpoints", "127.0.0.1:1", "--initial-cluster", ic}, "--initial-cluster has no effect with --etcd-endpoints"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string(nil), base...), tc.args...)
			if tc.args[0] == "--etcd-endpoints" {
				args = append([]string{"server"}, tc.args...)
			}
			r := drover(t, args...)
			if r.code != 2 || !strings.Contains(r.stderr, tc.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", r.code, r.stderr, tc.want)
			}
		})
	}
}
