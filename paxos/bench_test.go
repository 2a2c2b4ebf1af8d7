package paxos_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/paxos"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkLockService measures lock acquire+release cycles through the
// lock service's HTTP shape (POST /locks/{id} with owner and ttl, DELETE
// to release), 64 clients in one run, fsync on everywhere:
//
//   - paxos over the direct transport, three nodes;
//   - paxos over RabbitMQ (127.0.0.1:5672), three nodes;
//   - drover's etcd lock served by its HTTP API (/locks/{name} with owner
//     and ttl), one embedded etcd.
//
// names=64 gives each client a lock of its own; names=1 makes all 64
// contend for one lock (a 409 is retried after a random 0-2 ms). Clients
// send to the nodes in turn, as a load balancer in front of the group
// would. One b.N is one completed cycle; p50/p99 are per request;
// cpu-µs/cycle is the whole process's CPU (nodes, servers and clients).
// DROVER_BENCH_CLIENTS changes the number of clients.
func BenchmarkLockService(b *testing.B) {
	for _, names := range []int{64, 1} {
		b.Run(fmt.Sprintf("paxos-direct/names=%d", names), func(b *testing.B) {
			benchCycles(b, names, benchPaxos(b, "direct"), paxosShape)
		})
		b.Run(fmt.Sprintf("paxos-amqp/names=%d", names), func(b *testing.B) {
			benchCycles(b, names, benchPaxos(b, "amqp"), paxosShape)
		})
		b.Run(fmt.Sprintf("etcd-http/names=%d", names), func(b *testing.B) {
			benchCycles(b, names, benchEtcd(b), etcdShape)
		})
	}
}

// shape turns a cycle's two requests into HTTP requests of one API.
type shape struct {
	acquire func(base, name, owner string) (string, string, any)
	// release builds the release from the acquisition's answer.
	release func(base, name, owner string, ans map[string]any) (string, string, any)
}

var paxosShape = shape{
	acquire: func(base, name, owner string) (string, string, any) {
		return http.MethodPost, base + "/locks/" + name, map[string]any{"owner": owner, "ttl": 30}
	},
	release: func(base, name, owner string, ans map[string]any) (string, string, any) {
		return http.MethodDelete, base + "/locks/" + name, map[string]any{"owner": owner, "token": ans["token"]}
	},
}

var etcdShape = shape{
	acquire: func(base, name, owner string) (string, string, any) {
		return http.MethodPost, base + "/locks/" + name, map[string]any{"owner": owner, "ttl": 30}
	},
	release: func(base, name, owner string, ans map[string]any) (string, string, any) {
		q := url.Values{"owner": {owner}, "token": {fmt.Sprint(int64(ans["token"].(float64)))}, "contender": {fmt.Sprint(ans["contender"])}}
		return http.MethodDelete, base + "/locks/" + name + "?" + q.Encode(), nil
	},
}

// benchCycles runs b.N acquire+release cycles from 64 clients over bases.
func benchCycles(b *testing.B, names int, bases []string, sh shape) {
	clients := 64
	if s := os.Getenv("DROVER_BENCH_CLIENTS"); s != "" {
		if _, err := fmt.Sscan(s, &clients); err != nil || clients < 1 {
			b.Fatalf("DROVER_BENCH_CLIENTS=%q: want a positive number", s)
		}
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	defer hc.CloseIdleConnections()
	var left atomic.Int64
	left.Store(int64(b.N))
	var mu sync.Mutex
	var lat []time.Duration
	var conflicts atomic.Int64
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	b.ResetTimer()
	cpu0 := cpuTime()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			defer func() { mu.Lock(); lat = append(lat, mine...); mu.Unlock() }()
			name, owner := fmt.Sprintf("bench-%d", c%names), fmt.Sprintf("owner-%d", c)
			for i := 0; left.Add(-1) >= 0; i++ {
				base := bases[(c+i)%len(bases)]
				for try := 0; ; try++ {
					m, u, body := sh.acquire(base, name, owner)
					start := time.Now()
					ans, code, err := benchDo(hc, m, u, body)
					mine = append(mine, time.Since(start))
					if err != nil || try > 100000 {
						errs <- fmt.Errorf("acquire: %v (try %d)", err, try)
						return
					}
					if code == http.StatusConflict {
						conflicts.Add(1)
						time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
						continue
					}
					m, u, body = sh.release(base, name, owner, ans)
					start = time.Now()
					_, code, err = benchDo(hc, m, u, body)
					mine = append(mine, time.Since(start))
					if err != nil || code/100 != 2 {
						errs <- fmt.Errorf("release: %d %v", code, err)
						return
					}
					break
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/cycle")
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	if len(lat) > 0 {
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	b.ReportMetric(float64(conflicts.Load())/float64(b.N), "409s/cycle")
}

// cpuTime is the process's CPU time so far (user and system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchDo sends one JSON request; an answer other than 200 or 409 is an
// error.
func benchDo(hc *http.Client, method, u string, body any) (map[string]any, int, error) {
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	r, err := hc.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer r.Body.Close()
	raw, _ := io.ReadAll(r.Body)
	if r.StatusCode/100 != 2 && r.StatusCode != http.StatusConflict {
		return nil, r.StatusCode, fmt.Errorf("%s %s: %d %s", method, u, r.StatusCode, raw)
	}
	var ans map[string]any
	_ = json.Unmarshal(raw, &ans)
	return ans, r.StatusCode, nil
}

// benchPaxos starts three nodes with default timers on transport "direct"
// or "amqp", each serving the REST API on loopback, and returns their base
// URLs once the group grants a lock.
func benchPaxos(b *testing.B, transport string) []string {
	group := fmt.Sprintf("bench-%d", time.Now().UnixNano())
	var lns []net.Listener
	var peers []paxos.Peer
	for i := range 3 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		lns = append(lns, ln)
		peers = append(peers, paxos.Peer{ID: paxos.NodeID(i), Addr: ln.Addr().String()})
	}
	var bases []string
	for i, ln := range lns {
		id := paxos.NodeID(i)
		var tr paxos.Transport
		var direct http.Handler
		if transport == "amqp" {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			a, err := paxos.DialAMQP(ctx, paxos.AMQPConfig{URL: benchAMQPURL(), Group: group, ID: id})
			cancel()
			if err != nil {
				b.Skipf("RabbitMQ: %v", err)
			}
			tr = a
		} else {
			d := paxos.NewDirect(paxos.DirectConfig{ID: id, Group: group})
			tr, direct = d, d.Handler()
		}
		// Warnings (a campaign says why) go to stderr; the rest is dropped.
		logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
		node, err := paxos.NewNode(paxos.Config{ID: id, Group: group, Peers: peers, Transport: tr, DataDir: b.TempDir(),
			Logger: logger})
		if err != nil {
			b.Fatal(err)
		}
		if err := node.Start(context.Background()); err != nil {
			b.Fatal(err)
		}
		srv := &http.Server{Handler: paxos.NewAPI(node, paxos.APIConfig{Direct: direct, Logger: slog.New(slog.DiscardHandler)})}
		go func() { _ = srv.Serve(ln) }()
		b.Cleanup(func() { _ = srv.Close(); _ = node.Stop(); _ = tr.Close() })
		bases = append(bases, "http://"+ln.Addr().String())
	}
	return benchReady(b, bases)
}

// benchReady waits until the group at bases grants a lock, and returns
// bases.
func benchReady(b *testing.B, bases []string) []string {
	hc := &http.Client{Timeout: 2 * time.Second}
	for try := 0; ; try++ {
		ans, code, err := benchDo(hc, http.MethodPost, bases[0]+"/locks/ready", map[string]any{"owner": "ready", "ttl": 1})
		if err == nil && code == http.StatusOK {
			_, _, _ = benchDo(hc, http.MethodDelete, bases[0]+"/locks/ready", map[string]any{"owner": "ready", "token": ans["token"]})
			return bases
		}
		if try > 100 {
			b.Fatalf("group not ready: %d %v", code, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func benchAMQPURL() string {
	if u := os.Getenv("DROVER_RABBITMQ_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// benchEtcd serves drover's HTTP API on an embedded etcd with fsync on.
func benchEtcd(b *testing.B) []string {
	s := etcdtest.MustStart(etcdtest.Options{Fsync: true})
	b.Cleanup(s.Stop)
	api, err := httpapi.New(httpapi.Config{Etcd: s.Client(b), Namespace: fmt.Sprintf("bench-%d", time.Now().UnixNano()),
		Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = api.Serve(ln, "", "") }()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = api.Close(ctx)
	})
	return []string{"http://" + ln.Addr().String()}
}
