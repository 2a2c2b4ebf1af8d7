package paxos_test

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/steal"
)

// BenchmarkLockServiceLatency measures lock acquire+release cycles at an
// offered load below saturation (DROVER_BENCH_RATE, default 1,000 cycles/s
// in all) from 64 clients, each on a lock name of its own, over the same
// three backends as BenchmarkLockService in one run. Open loop: each
// cycle starts on its schedule whether or not the client's previous one
// has ended, and its latency is taken from that scheduled start, so that
// time spent behind a slow cycle counts. A closed loop of 64 clients
// measures mostly its own queue (latency about 64 ÷ throughput at
// saturation); this is the latency a fleet sees at a load the service
// carries. It reports p50/p99 of cycles (two requests each) and p99 of
// single requests.
//
//	go test ./paxos -run '^$' -bench BenchmarkLockServiceLatency -benchtime 10000x
func BenchmarkLockServiceLatency(b *testing.B) {
	rate := 1000
	if v := os.Getenv("DROVER_BENCH_RATE"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			b.Fatalf("DROVER_BENCH_RATE=%q: want a positive number of cycles a second", v)
		}
		rate = n
	}
	b.Run("paxos-direct", func(b *testing.B) { openCycles(b, rate, toLeader(b, benchPaxos(b, "direct")), paxosShape) })
	b.Run("paxos-direct-procs", func(b *testing.B) { openCycles(b, rate, toLeader(b, benchPaxosProcs(b)), paxosShape) })
	b.Run("paxos-amqp", func(b *testing.B) { openCycles(b, rate, toLeader(b, benchPaxos(b, "amqp")), paxosShape) })
	b.Run("etcd-http", func(b *testing.B) { openCycles(b, rate, benchEtcd(b), etcdShape) })
}

// toLeader is bases, or with DROVER_BENCH_PAXOS_TO=leader only the base of
// the group's leader: the clients then send every request to the leader,
// as client.Client does once an answer named it (Paxos-Leader), instead of
// spreading them over the nodes as a load balancer in front of the group
// does (the followers forward theirs).
func toLeader(b *testing.B, bases []string) []string {
	switch to := os.Getenv("DROVER_BENCH_PAXOS_TO"); to {
	case "":
		return bases
	case "leader":
	default:
		b.Fatalf("DROVER_BENCH_PAXOS_TO=%q: want leader, or unset for every node", to)
	}
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, base := range bases {
		if ans, code, err := benchDo(hc, http.MethodGet, base+"/status", nil); err == nil && code == http.StatusOK && ans["role"] == "leader" {
			return []string{base}
		}
	}
	b.Fatal("no node says it leads")
	return nil
}

// openCycles runs b.N cycles from 64 clients on 64 names over bases at
// rate cycles a second in all (client c's i-th at start + (i*64+c)/rate).
func openCycles(b *testing.B, rate int, bases []string, sh shape) {
	const clients = 64
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256}}
	defer hc.CloseIdleConnections()
	var mu sync.Mutex
	var cycles, reqs []time.Duration
	var timed []timedReq
	errs := make(chan error, clients)
	every := time.Second / time.Duration(rate)
	var wg sync.WaitGroup
	b.ResetTimer()
	start, steal0 := time.Now(), steal.Total()
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine, one []time.Duration
			var when []timedReq
			defer func() {
				mu.Lock()
				cycles, reqs, timed = append(cycles, mine...), append(reqs, one...), append(timed, when...)
				mu.Unlock()
			}()
			name, owner := fmt.Sprintf("bench-%d", c), fmt.Sprintf("owner-%d", c)
			for i := 0; i*clients+c < b.N; i++ {
				at := start.Add(time.Duration(i*clients+c) * every)
				time.Sleep(time.Until(at))
				node := (c + i) % len(bases)
				base := bases[node]
				m, u, body := sh.acquire(base, name, owner)
				t0 := time.Now()
				ans, code, err := benchDo(hc, m, u, body)
				one = append(one, time.Since(t0))
				when = append(when, timedReq{t0.Sub(start), one[len(one)-1], node})
				if err != nil || code != http.StatusOK {
					errs <- fmt.Errorf("acquire %s: %d %v (its own name: never held by another)", name, code, err)
					return
				}
				m, u, body = sh.release(base, name, owner, ans)
				t0 = time.Now()
				_, code, err = benchDo(hc, m, u, body)
				one = append(one, time.Since(t0))
				if err != nil || code/100 != 2 {
					errs <- fmt.Errorf("release %s: %d %v", name, code, err)
					return
				}
				mine = append(mine, time.Since(at))
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	reportStolen(b, steal0)
	writeHeapProfile(b)
	close(errs)
	if err := <-errs; err != nil {
		b.Fatal(err)
	}
	reportEnds(b, timed, time.Since(start))
	b.ReportMetric(p99ms(cycles), "p99-ms") // sorts cycles
	b.ReportMetric(float64(cycles[len(cycles)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(p99ms(reqs), "request-p99-ms")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
	// Each election raises the ballot's round: a tail of several hundred
	// milliseconds is a leader change (500 ms election timeout). The etcd
	// shape's server has no /status.
	// Snapshots sent to catch a node up are reported too: each is the
	// whole table, installed on the receiver's loop.
	// So are the nodes' own measures of an election's cause (stalls.go):
	// campaigns, timers restarted for a stall of the node's own loop, its
	// rounds over half an election timeout and the longest.
	var sent, elections, restarts, stalls, longest float64
	leader := -1
	for i, base := range bases {
		ans, code, err := benchDo(hc, http.MethodGet, base+"/status", nil)
		if err != nil || code != http.StatusOK {
			return
		}
		if ballot, ok := ans["ballot"].(map[string]any); ok && i == 0 {
			if r, ok := ballot["r"].(float64); ok {
				b.ReportMetric(r, "ballot-round")
			}
		}
		if ans["role"] == "leader" {
			leader = i
		}
		num := func(k string) float64 { f, _ := ans[k].(float64); return f }
		sent += num("snapshots_sent")
		elections += num("elections_started")
		restarts += num("timer_restarts")
		stalls += num("loop_stalls")
		longest = max(longest, num("longest_round_ms"))
	}
	b.ReportMetric(sent, "snapshots-sent")
	b.ReportMetric(elections, "elections")
	b.ReportMetric(restarts, "timer-restarts")
	b.ReportMetric(stalls, "loop-stalls")
	b.ReportMetric(longest, "longest-round-ms")
	reportByRole(b, timed, leader)
}

// reportByRole reports the p99 of the acquire requests asked of the
// leader (leader-request-p99-ms) and of the other nodes, which forward
// them to it and answer once they applied the result
// (follower-request-p99-ms).
func reportByRole(b *testing.B, timed []timedReq, leader int) {
	if leader < 0 {
		return
	}
	var led, followed []time.Duration
	for _, r := range timed {
		if r.node == leader {
			led = append(led, r.d)
		} else {
			followed = append(followed, r.d)
		}
	}
	b.ReportMetric(p99ms(led), "leader-request-p99-ms")
	b.ReportMetric(p99ms(followed), "follower-request-p99-ms")
}

// p99ms is the 99th percentile of d in milliseconds (0 if d is empty); it
// sorts d.
func p99ms(d []time.Duration) float64 {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return float64(d[len(d)*99/100].Microseconds()) / 1000
}

// writeHeapProfile writes the live heap, with the group still running, to
// the file DROVER_BENCH_HEAPPROFILE names, if set (-test.memprofile is
// written after the nodes stopped).
func writeHeapProfile(b *testing.B) {
	path := os.Getenv("DROVER_BENCH_HEAPPROFILE")
	if path == "" {
		return
	}
	f, err := os.Create(path)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		b.Fatal(err)
	}
}

// timedReq is a request's latency d and when it started, from the run's
// start.
type timedReq struct {
	at, d time.Duration
	node  int // the index in bases of the node asked
}

// reportEnds reports the p99 of the acquire requests of the run's first
// and last fifth (first-fifth-p99-ms, last-fifth-p99-ms): a tail that
// grows with the run (the memory of results, the snapshots, the log)
// shows as a difference between the two.
func reportEnds(b *testing.B, timed []timedReq, run time.Duration) {
	var first, last []time.Duration
	for _, r := range timed {
		switch {
		case r.at < run/5:
			first = append(first, r.d)
		case r.at >= run*4/5:
			last = append(last, r.d)
		}
	}
	b.ReportMetric(p99ms(first), "first-fifth-p99-ms")
	b.ReportMetric(p99ms(last), "last-fifth-p99-ms")
}

// reportStolen reports the steal since from, in ms (steal-ms).
func reportStolen(b *testing.B, from time.Duration) {
	b.ReportMetric(float64((steal.Total() - from).Milliseconds()), "steal-ms")
}
