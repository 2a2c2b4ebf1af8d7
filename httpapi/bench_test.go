package httpapi_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sort"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/internal/testenv/steal"
	"github.com/droverhq/drover/lock"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fsyncServer starts an embedded etcd with fsync on, as users run it,
// for one benchmark: it stops when the benchmark ends.
func fsyncServer(b *testing.B) *etcdtest.Server {
	s := etcdtest.MustStart(etcdtest.Options{Fsync: true})
	b.Cleanup(s.Stop)
	return s
}

// benchClients are the clients of s that a benchmark's two sides use, as
// users run them: goCli, a Go program's (the Go worker or locker, and
// whoever submits tasks), is a gRPC client over the loopback, as in a
// process of its own; httpCli, the HTTP API's, calls the embedded etcd in
// process, as drover server's does (cluster.Server.LocalClient).
// DROVER_BENCH_ETCD_CLIENT=local or grpc gives both sides that kind: local
// as a Go program that embeds etcd has it, grpc as a drover server in front
// of an etcd cluster (--etcd-endpoints) has it.
func benchClients(b *testing.B, s *etcdtest.Server) (goCli, httpCli *clientv3.Client) {
	switch v := os.Getenv("DROVER_BENCH_ETCD_CLIENT"); v {
	case "":
		return s.Client(b), s.LocalClient(b)
	case "local":
		cli := s.LocalClient(b)
		return cli, cli
	case "grpc":
		cli := s.Client(b)
		return cli, cli
	default:
		b.Fatalf("DROVER_BENCH_ETCD_CLIENT=%q: want local or grpc (unset: each side as users run it)", v)
		return nil, nil
	}
}

// latencies collects per-operation latencies and reports their p99.
type latencies struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *latencies) add(d time.Duration) { l.mu.Lock(); l.d = append(l.d, d); l.mu.Unlock() }

func (l *latencies) report(b *testing.B) {
	sort.Slice(l.d, func(i, j int) bool { return l.d[i] < l.d[j] })
	if len(l.d) > 0 {
		b.ReportMetric(float64(l.d[len(l.d)*99/100].Microseconds())/1000, "p99-ms")
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkLockCycle compares lock acquire+release cycles over the HTTP
// API (one session per client, keep-alive connections) with the Go lock
// (one locker per goroutine), on one fsync'd embedded etcd in one run: 64
// clients, each on a lock of its own.
func BenchmarkLockCycle(b *testing.B) {
	const clients = 64
	s := fsyncServer(b)
	goCli, httpCli := benchClients(b, s)
	b.Run("go", func(b *testing.B) {
		lockers := goLockers(b, goCli, fmt.Sprintf("bench-go-%d", time.Now().UnixNano()), clients)
		var lat latencies
		runClients(b, clients, func(c, i int) error {
			start := time.Now()
			held, err := lockers[c].TryAcquire(context.Background(), fmt.Sprintf("l%d", c))
			if err != nil {
				return err
			}
			err = held.Release(context.Background())
			lat.add(time.Since(start))
			return err
		})
		lat.report(b)
	})
	b.Run("http", func(b *testing.B) {
		ns := fmt.Sprintf("bench-http-%d", time.Now().UnixNano())
		base, hc := benchAPI(b, httpCli, ns)
		sessions := httpSessions(b, hc, base, clients)
		var lat latencies
		runClients(b, clients, func(c, i int) error {
			start := time.Now()
			var got struct {
				Token     int64
				Contender string
			}
			if err := call(hc, "POST", fmt.Sprintf("%s/v1/locks/l%d", base, c), map[string]any{"session": sessions[c]}, 200, &got); err != nil {
				return err
			}
			err := call(hc, "DELETE", fmt.Sprintf("%s/v1/locks/l%d?token=%d&session=%s&contender=%s", base, c, got.Token, sessions[c], got.Contender), nil, 204, nil)
			lat.add(time.Since(start))
			return err
		})
		lat.report(b)
	})
}

// goLockers returns n Go lockers of namespace ns, closed when the
// benchmark ends.
func goLockers(b *testing.B, cli *clientv3.Client, ns string, n int) []*lock.Etcd {
	lockers := make([]*lock.Etcd, n)
	for i := range lockers {
		l, err := lock.NewEtcd(context.Background(), cli, lock.EtcdConfig{Namespace: ns, TTL: 30 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Close(context.Background()) })
		lockers[i] = l
	}
	return lockers
}

// httpSessions opens n sessions (TTL 30 s) on the API at base.
func httpSessions(b *testing.B, hc *http.Client, base string, n int) []string {
	sessions := make([]string, n)
	for i := range sessions {
		var out struct{ ID string }
		if err := call(hc, "POST", base+"/v1/sessions", map[string]any{"ttl": 30}, 201, &out); err != nil {
			b.Fatal(err)
		}
		sessions[i] = out.ID
	}
	return sessions
}

// cpuTime is the process's CPU time so far (user and system): the
// embedded etcd, the server and the clients all run in it.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportStolen reports the steal since from, in ms (steal-ms).
func reportStolen(b *testing.B, from time.Duration) {
	b.ReportMetric(float64((steal.Total() - from).Milliseconds()), "steal-ms")
}

// runClients runs b.N operations spread over n goroutines, op(client, i),
// and reports the process's CPU time per operation.
func runClients(b *testing.B, n int, op func(c, i int) error) {
	b.Helper()
	cpu0 := cpuTime()
	defer func() { b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op") }()
	var wg sync.WaitGroup
	next := make(chan int, b.N)
	for i := 0; i < b.N; i++ {
		next <- i
	}
	close(next)
	errs := make(chan error, n)
	b.ResetTimer()
	for c := 0; c < n; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := op(c, i); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
}

// benchAPI serves the API on cli in namespace ns for the benchmark, and
// returns its base URL and a keep-alive client.
func benchAPI(b *testing.B, cli *clientv3.Client, ns string) (string, *http.Client) {
	s, err := httpapi.New(httpapi.Config{Etcd: cli, Namespace: ns, Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go func() { _ = s.Serve(l, "", "") }()
	b.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	return "http://" + l.Addr().String(), hc
}

// call sends a JSON request and decodes the answer into out, unless its
// status is not want.
func call(hc *http.Client, method, url string, body any, want int, out any) error {
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	r, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer r.Body.Close()
	raw, err := io.ReadAll(r.Body)
	if err != nil {
		return err
	}
	if r.StatusCode != want {
		return fmt.Errorf("%s %s: %d: %s", method, url, r.StatusCode, raw)
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}
