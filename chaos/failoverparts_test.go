package chaos

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The parts of TestLeaderFailover besides the queue and the registry:
// the lock client processes, the write probe, and clients whose first
// connection is to a chosen member.

// failoverNS is the namespace of the locks, the registry and the probe.
const failoverNS = "failover"

// clusterOfThree starts a three-member cluster of drover servers, or
// skips the test when `drover server` lacks a flag to form one.
func clusterOfThree(t *testing.T) *etcdSet {
	t.Helper()
	bin := droverBin(t)
	if f := missingClusterFlag(t, bin); f != "" {
		t.Skipf("drover server has no %s flag: the three-member scenario needs --name, --initial-cluster, --etcd-peer-listen, --etcd-listen and --data-dir", f)
	}
	return startEtcdSet(t, bin, 3)
}

// pinnedClient is a client whose connections begin with member m alone;
// widen gives it every member's endpoint afterwards. A stream opened
// before (a watch) stays on m until m fails, then moves to another member.
func pinnedClient(t *testing.T, set *etcdSet, m *member) (cli *clientv3.Client, widen func()) {
	t.Helper()
	cli = etcdClient(t, []string{m.endpoint()})
	return cli, func() { cli.SetEndpoints(set.endpoints()...) }
}

// startLockClients starts cfg.clients lock client processes
// (chaos/internal/lockclient) on the etcd of set, every endpoint given:
// they take cfg.names at random (acquire, fenced write, release) until
// stopLockClients ends them; cfg.cycles only bounds them.
func startLockClients(t *testing.T, set *etcdSet, cfg lockConfig) *lockRun {
	env := []string{"CHAOS_BACKEND=etcd", "CHAOS_ADDR=" + strings.Join(set.endpoints(), ","), "CHAOS_NS=" + failoverNS}
	r := newLockRun(t, cfg, env, nil)
	for range cfg.clients {
		r.startClient(cfg.cycles)
	}
	return r
}

// stopLockClients ends every lock client with SIGTERM (each finishes the
// cycle under way, its release settled) and waits up to d until all have
// exited; a client that exited with an error fails the test.
func (r *lockRun) stopLockClients(d time.Duration) {
	r.mu.Lock()
	clients := slices.Clone(r.clients)
	r.mu.Unlock()
	for _, c := range clients {
		_ = c.signal(syscall.SIGTERM)
	}
	for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if r.finished() {
			return
		}
	}
	r.dumpStuck()
	r.t.Fatalf("the lock clients did not stop within %s of SIGTERM", d)
}

// firstGrantAfter is how long after at the first acquisition that began
// after at was granted; false when none was.
func (r *lockRun) firstGrantAfter(at time.Time) (time.Duration, bool) {
	best := int64(0)
	for _, op := range r.ops {
		if op.Input.(lockInput).Kind == opAcquire && op.Call > at.UnixNano() && (best == 0 || op.Return < best) {
			best = op.Return
		}
	}
	return time.Duration(best - at.UnixNano()), best > 0
}

// writeProbe puts a key every 10 ms, each attempt bounded to 300 ms, and
// records when each attempt began and ended and whether it succeeded.
type writeProbe struct {
	mu    sync.Mutex
	tries []probeTry
}

// probeTry is one attempt of the probe.
type probeTry struct {
	began, ended time.Time
	ok           bool
}

// runProbe starts the probe on cli, until stop ends.
func runProbe(stop context.Context, cli *clientv3.Client, wg *sync.WaitGroup) *writeProbe {
	p := &writeProbe{}
	wg.Go(func() {
		key := keyspace.MustNew(failoverNS).Root() + "probe"
		for i := 0; stop.Err() == nil; i++ {
			began := time.Now()
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			_, err := cli.Put(ctx, key, fmt.Sprint(i))
			cancel()
			p.mu.Lock()
			p.tries = append(p.tries, probeTry{began: began, ended: time.Now(), ok: err == nil})
			p.mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	})
	return p
}

// firstWriteAfter is how long after at the first write that began after
// at succeeded, and how many attempts failed before it; false when none
// succeeded.
func (p *writeProbe) firstWriteAfter(at time.Time) (time.Duration, int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	failed := 0
	for _, tr := range p.tries {
		switch {
		case !tr.began.After(at):
		case tr.ok:
			return tr.ended.Sub(at), failed, true
		default:
			failed++
		}
	}
	return 0, failed, false
}

// lastFailure is the end of the last attempt that failed; zero when none.
func (p *writeProbe) lastFailure() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var last time.Time
	for _, tr := range p.tries {
		if !tr.ok {
			last = tr.ended
		}
	}
	return last
}

// watchStreams reads how many watch streams member m serves, from the
// etcd_debugging_mvcc_watch_stream_total gauge its client URL publishes
// on /metrics; false when it cannot tell.
func watchStreams(m *member) (int, bool) {
	hc := http.Client{Timeout: 2 * time.Second}
	resp, err := hc.Get(m.clientURL + "/metrics")
	if err != nil {
		return 0, false
	}
	defer resp.Body.Close()
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if v, ok := strings.CutPrefix(sc.Text(), "etcd_debugging_mvcc_watch_stream_total "); ok {
			n, err := strconv.ParseFloat(v, 64)
			return int(n), err == nil
		}
	}
	return 0, false
}

// describeStreams lists the watch streams each member serves, for the log.
func describeStreams(set *etcdSet) string {
	var s []string
	for _, m := range set.members {
		n, ok := watchStreams(m)
		if !ok {
			s = append(s, m.name+" ?")
			continue
		}
		s = append(s, fmt.Sprintf("%s %d", m.name, n))
	}
	return strings.Join(s, ", ")
}
