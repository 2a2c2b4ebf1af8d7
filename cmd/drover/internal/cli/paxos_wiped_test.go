package cli_test

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestPaxosServeRefusesAWipedMember: a member restarted on an empty data
// dir (a wiped volume) with itself in --peers would come back with no
// promise and no accepted value, and vote as if it had promised nothing.
// It must be refused (exit 2, nothing written, saying what to do), and the
// procedure it names (remove it, start it with --join, add it) must work.
func TestPaxosServeRefusesAWipedMember(t *testing.T) {
	g := startPaxosNodes(t, 3)
	backend := []string{"lock", "--lock-backend", "paxos://" + g.endpoints()}
	if r := drover(t, append(backend, "run", "before-the-wipe", "--", "true")...); r.code != 0 {
		t.Fatalf("lock run: exit %d, %q", r.code, r.stderr)
	}
	g.stop(t, 0)
	if err := os.RemoveAll(g.dirs[0]); err != nil {
		t.Fatal(err)
	}
	p := start(t, cleanEnv(), "paxos", "serve", "--id", "0", "--peers", g.peers(), "--transport", "direct",
		"--data-dir", g.dirs[0], "--request-timeout", "3s")
	code := p.wait(t, 30*time.Second)
	stderr := p.stderr.String()
	for _, want := range []string{"--data-dir", "already has state", "members remove --id 0", "--join", "members add --id 0"} {
		if code != 2 || !strings.Contains(stderr, want) {
			t.Fatalf("a member on a wiped data dir: exit %d, want 2 and a message saying %q:\n%s", code, want, stderr)
		}
	}
	if _, err := os.Stat(g.dirs[0]); !os.IsNotExist(err) {
		t.Fatalf("the refused node wrote its data dir: %v", err)
	}

	// The procedure the message gives.
	others := g.addrs[1] + "," + g.addrs[2]
	if r := drover(t, "paxos", "members", "remove", "--id", "0", "--endpoints", others); r.code != 0 {
		t.Fatalf("members remove: exit %d, %q", r.code, r.stderr)
	}
	current := fmt.Sprintf("1=%s,2=%s", g.addrs[1], g.addrs[2])
	g.procs[0] = start(t, cleanEnv(), "paxos", "serve", "--join", "--id", "0", "--listen", g.addrs[0], "--peers", current,
		"--transport", "direct", "--data-dir", g.dirs[0], "--request-timeout", "3s")
	if r := drover(t, "paxos", "members", "add", "--id", "0", "--addr", g.addrs[0], "--endpoints", others); r.code != 0 {
		t.Fatalf("members add: exit %d, %q", r.code, r.stderr)
	}
	waitFor(t, 15*time.Second, "node 0 to vote again", func() bool {
		r := drover(t, "paxos", "status", "--endpoints", g.endpoints(), "--json")
		return regexp.MustCompile(`"id":0,"role":"(follower|leader)"`).MatchString(r.stdout)
	})
	if r := drover(t, append(backend, "run", "after-the-rejoin", "--", "true")...); r.code != 0 {
		t.Fatalf("lock run after the rejoin: exit %d, %q", r.code, r.stderr)
	}
	for i := range g.procs {
		_ = g.procs[i].cmd.Process.Signal(syscall.SIGTERM)
	}
	for i := range g.procs {
		if code := g.procs[i].wait(t, 20*time.Second); code != 0 {
			t.Fatalf("node %d after SIGTERM: exit %d: %s", i, code, g.procs[i].stderr.String())
		}
	}
}
