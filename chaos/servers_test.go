package chaos

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// etcdSet is one `drover server` process per etcd member, on loopback
// ports, each with a data dir kept across restarts and a log file that
// restarts append to.
type etcdSet struct {
	t       *testing.T
	bin     string
	members []*member
}

// member is one `drover server` of the set.
type member struct {
	name      string
	dir       string
	clientURL string
	peerURL   string
	httpAddr  string // the HTTP API's host:port; "" when it serves none
	args      []string
	log       *os.File
	proc      *process
	admin     *clientv3.Client // reaches this member only: status and leader
}

// endpoint is the member's client address, host:port.
func (m *member) endpoint() string { return strings.TrimPrefix(m.clientURL, "http://") }

// dataDir returns a directory for a server's data that the test removes:
// on tmpfs (/dev/shm) when the machine has one. The faults here kill
// processes, not the machine, and a killed process loses nothing the page
// cache holds, so fsync would cost time without changing what is tested.
func dataDir(t *testing.T) string {
	t.Helper()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		if d, err := os.MkdirTemp("/dev/shm", "drover-chaos-"); err == nil {
			t.Cleanup(func() { _ = os.RemoveAll(d) })
			return d
		}
	}
	return t.TempDir()
}

// freeAddr is a loopback host:port that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// freeURL is an http URL on a loopback port that was free a moment ago.
func freeURL(t *testing.T) string { t.Helper(); return "http://" + freeAddr(t) }

// etcdClient connects to endpoints without logging.
func etcdClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// startEtcdSet starts n servers and waits until they serve with a leader.
// n == 1 is a plain `drover server`; n > 1 forms a cluster with
// --name and --initial-cluster. The ports are found free before the
// servers bind them, so another process of a busy machine may take one
// between the two: a set whose member exits at start on a port in use is
// started again on other ports, up to three times.
func startEtcdSet(t *testing.T, bin string, n int) *etcdSet {
	t.Helper()
	return startEtcdSetHTTP(t, bin, n, false)
}

// startEtcdSetHTTP is startEtcdSet, with each member serving the HTTP API
// (--http-listen on a loopback port, member.httpAddr) when http is set.
func startEtcdSetHTTP(t *testing.T, bin string, n int, http bool) *etcdSet {
	t.Helper()
	for try := 1; ; try++ {
		s, err := tryEtcdSet(t, bin, n, http)
		if err == nil {
			return s
		}
		if try == 3 || !errors.Is(err, errPortTaken) {
			t.Fatal(err)
		}
		t.Logf("starting the servers again on other ports: %v", err)
	}
}

// errPortTaken: a member exited at start because its port was taken.
var errPortTaken = errors.New("a port was taken before the server bound it")

// tryEtcdSet is one try of startEtcdSet; on error its processes are
// killed.
func tryEtcdSet(t *testing.T, bin string, n int, http bool) (*etcdSet, error) {
	t.Helper()
	s := &etcdSet{t: t, bin: bin}
	var initial []string
	for i := range n {
		m := &member{name: fmt.Sprintf("s%d", i+1), dir: filepath.Join(dataDir(t), "data"), clientURL: freeURL(t), peerURL: freeURL(t)}
		initial = append(initial, m.name+"="+m.peerURL)
		s.members = append(s.members, m)
	}
	for _, m := range s.members {
		m.args = []string{"server", "--data-dir", m.dir, "--etcd-listen", m.clientURL, "--etcd-peer-listen", m.peerURL, "--log-level", "warn"}
		if n > 1 {
			m.args = append(m.args, "--name", m.name, "--initial-cluster", strings.Join(initial, ","))
		}
		if http {
			m.httpAddr = freeAddr(t)
			m.args = append(m.args, "--http-listen", m.httpAddr)
		}
		f, err := os.OpenFile(filepath.Join(t.TempDir(), m.name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		m.log = f
		m.admin = etcdClient(t, []string{m.endpoint()})
		s.start(m)
	}
	for _, m := range s.members {
		if _, err := s.waitReady(m, time.Minute); err != nil {
			for _, o := range s.members {
				o.proc.kill()
			}
			if log, _ := os.ReadFile(m.log.Name()); m.proc.exited() && bytes.Contains(log, []byte("address already in use")) {
				return nil, fmt.Errorf("%w: %v", errPortTaken, err)
			}
			return nil, err
		}
	}
	return s, nil
}

// start starts member m's process.
func (s *etcdSet) start(m *member) {
	fmt.Fprintf(m.log, "--- chaos: start %s at %s\n", m.name, time.Now().Format(time.RFC3339Nano))
	m.proc = startProcess(s.t, m.name, m.log, m.log, nil, s.bin, m.args...)
}

// endpoints lists every member's client address.
func (s *etcdSet) endpoints() []string {
	var eps []string
	for _, m := range s.members {
		eps = append(eps, m.endpoint())
	}
	return eps
}

// status asks member m alone how it is; the leader's member ID is in it.
func (m *member) status(d time.Duration) (*clientv3.StatusResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return m.admin.Status(ctx, m.endpoint())
}

// waitReady waits up to d until member m answers with a leader known, and
// returns when it did.
func (s *etcdSet) waitReady(m *member, d time.Duration) (time.Time, error) {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if m.proc.exited() {
			return time.Time{}, fmt.Errorf("%s exited (%v); its log: %s", m.name, m.proc.err, m.log.Name())
		}
		if st, err := m.status(500 * time.Millisecond); err == nil && st.Leader != 0 {
			return time.Now(), nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Time{}, fmt.Errorf("%s not ready within %s; its log: %s", m.name, d, m.log.Name())
}

// leader returns the member that leads, as the members that answer say.
func (s *etcdSet) leader() (*member, error) {
	for _, m := range s.members {
		if m.proc.exited() {
			continue
		}
		st, err := m.status(500 * time.Millisecond)
		if err != nil || st.Leader == 0 {
			continue
		}
		for _, o := range s.members {
			if o.proc.exited() {
				continue // a killed member answers no one: asking it would only wait
			}
			if ost, err := o.status(500 * time.Millisecond); err == nil && ost.Header.MemberId == st.Leader {
				return o, nil
			}
		}
	}
	return nil, fmt.Errorf("no member names a leader that answers")
}

// outage is one server killed with SIGKILL and started again on its data
// dir: when it was killed, when the set had a leader again without it
// (three members only), and when it served again.
type outage struct {
	member  string
	killed  time.Time
	elected time.Time
	ready   time.Time
}

// killAndRestart kills member m with SIGKILL, waits for the others to
// elect a leader (when there are others), keeps m down for down more, and
// starts it again on its data dir. afterKill runs once m has died.
func (s *etcdSet) killAndRestart(m *member, down time.Duration, afterKill ...func()) outage {
	s.t.Helper()
	o := outage{member: m.name}
	_ = m.proc.signal(syscall.SIGKILL)
	o.killed = time.Now()
	<-m.proc.done
	for _, f := range afterKill {
		f()
	}
	if len(s.members) > 1 {
		deadline := time.Now().Add(30 * time.Second)
		for o.elected.IsZero() && time.Now().Before(deadline) {
			if l, err := s.leader(); err == nil && l != m {
				o.elected = time.Now()
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		if o.elected.IsZero() {
			s.t.Errorf("no new leader within 30 s of killing %s", m.name)
			for _, o := range s.members { // what the survivors said meanwhile
				if o != m {
					logTail(s.t, o.log.Name())
				}
			}
		}
	}
	time.Sleep(down)
	s.start(m)
	ready, err := s.waitReady(m, time.Minute)
	if err != nil {
		s.t.Fatal(err)
	}
	o.ready = ready
	return o
}

// missingClusterFlag names the first flag that `drover server` lacks to
// form a three-member cluster, or "" when it has them all.
func missingClusterFlag(t *testing.T, bin string) string {
	t.Helper()
	out, err := exec.Command(bin, "server", "--help").CombinedOutput()
	if err != nil {
		t.Fatalf("drover server --help: %v\n%s", err, out)
	}
	for _, f := range []string{"--name", "--initial-cluster", "--etcd-peer-listen", "--etcd-listen", "--data-dir"} {
		if !strings.Contains(string(out), f+" ") {
			return f
		}
	}
	return ""
}
