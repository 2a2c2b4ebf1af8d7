package stream_test

import (
	"bufio"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/stream"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestStreamsAtScale measures many streams at once: with
// DROVER_BENCH_STREAMS=N (DROVER_BENCH_STREAMS_RATE events a second
// each, default 20; DROVER_BENCH_STREAMS_SECONDS, default 20) it runs N
// streams, each emitted by a goroutine of one Writer (one worker process)
// and followed by one follower of one Hub (one server), against an
// embedded etcd with fsync on, and logs the emit-to-follower latency
// (p50, p99, max), etcd's writes a second (the Writer's transactions,
// and the raft proposals etcd committed), the process's CPU (an event, a
// chunk), how long its goroutines waited to run and its GC's pauses.
// DROVER_BENCH_STREAMS_PROFILE=dir writes a CPU profile of the measured
// window (dir/cpu.pprof) and the allocations (dir/allocs.pprof).
func TestStreamsAtScale(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_STREAMS"))
	if n <= 0 {
		t.Skip("set DROVER_BENCH_STREAMS=1000 to measure")
	}
	rate := envInt("DROVER_BENCH_STREAMS_RATE", 20)
	secs := envInt("DROVER_BENCH_STREAMS_SECONDS", 20)
	es, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Stop()
	wcli, fcli := es.Client(t), es.Client(t)
	keys := keyspace.MustNew("bench")
	ctx := context.Background()
	claims := benchClaims(t, wcli, keys, n)
	w := stream.For(wcli, keys)
	hub := stream.NewHub(fcli, keys)
	// The emitters are handlers' stream.Emit (queued, sent while they go
	// on), or with DROVER_BENCH_STREAMS_SYNC=1 Writer.Append (returns once
	// stored, as drover emit and the HTTP route do).
	syncEmit := os.Getenv("DROVER_BENCH_STREAMS_SYNC") == "1"
	atts := make([]*stream.Attempt, n)
	for i := range n {
		_, atts[i] = stream.Begin(ctx, wcli, keys, claims[i], false)
	}

	warm := time.Now().Add(3 * time.Second)
	end := warm.Add(time.Duration(secs) * time.Second)
	lat := make([][]time.Duration, n)
	stored := make([][]time.Duration, n)
	var followers, emitters sync.WaitGroup
	fctx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	for i := range n {
		followers.Go(func() {
			for ev, err := range hub.Follow(fctx, claims[i].Task, 0) {
				if err != nil {
					return
				}
				if ev.Type == "token" && ev.Time.After(warm) && ev.Time.Before(end) {
					lat[i] = append(lat[i], time.Since(ev.Time))
				}
			}
		})
	}
	data := json.RawMessage(`{"text":"token"}`)
	for i := range n {
		emitters.Go(func() {
			time.Sleep(time.Duration(rand.Int64N(int64(time.Second / time.Duration(rate)))))
			tick := time.NewTicker(time.Second / time.Duration(rate))
			defer tick.Stop()
			for now := range tick.C {
				if now.After(end) {
					return
				}
				began := time.Now()
				var err error
				if syncEmit {
					_, _, err = w.Append(ctx, claims[i], []stream.Input{{Type: "token", Data: data}})
				} else {
					err = atts[i].Emit(ctx, stream.Input{Type: "token", Data: data})
				}
				if err != nil {
					t.Errorf("stream %d: %v", i, err)
					return
				}
				if began.After(warm) {
					stored[i] = append(stored[i], time.Since(began))
				}
			}
		})
	}
	time.Sleep(time.Until(warm))
	stopProfile := startProfile(t, os.Getenv("DROVER_BENCH_STREAMS_PROFILE"))
	sched0 := runtimeHist("/sched/latencies:seconds")
	gc0 := runtimeHist("/sched/pauses/total/gc:seconds")
	tx0, prop0, puts0, cpu0 := w.Transactions(), metric(t, es, "etcd_server_proposals_committed_total"), metric(t, es, "etcd_mvcc_put_total"), processCPU()
	time.Sleep(time.Until(end))
	tx1, prop1, puts1, cpu1 := w.Transactions(), metric(t, es, "etcd_server_proposals_committed_total"), metric(t, es, "etcd_mvcc_put_total"), processCPU()
	stopProfile()
	sched, gcp := runtimeHist("/sched/latencies:seconds").since(sched0), runtimeHist("/sched/pauses/total/gc:seconds").since(gc0)
	emitters.Wait()
	time.Sleep(500 * time.Millisecond) // the last events reach their followers
	stopFollow()
	followers.Wait()

	var all, st []time.Duration
	for i := range lat {
		all, st = append(all, lat[i]...), append(st, stored[i]...)
	}
	slices.Sort(all)
	slices.Sort(st)
	if len(all) == 0 {
		t.Fatal("no event measured")
	}
	pct := func(p float64) time.Duration { return all[min(len(all)-1, int(p*float64(len(all))))] }
	t.Logf("the emit call (sync %v): p50 %s p99 %s", syncEmit, st[len(st)/2].Round(100*time.Microsecond), st[len(st)*99/100].Round(100*time.Microsecond))
	window := float64(secs)
	t.Logf("%d streams x %d events/s, %ds measured: %d events delivered (%.0f/s); emit to follower p50 %s p99 %s max %s; "+
		"writer transactions %.0f/s; etcd proposals %.0f/s; process CPU %.2f cores (etcd, writer and followers)",
		n, rate, secs, len(all), float64(len(all))/window, pct(0.5).Round(100*time.Microsecond), pct(0.99).Round(100*time.Microsecond),
		all[len(all)-1].Round(time.Millisecond), float64(tx1-tx0)/window, (prop1-prop0)/window, (cpu1-cpu0).Seconds()/window)
	// What a chunk costs, whatever the CPU the machine gave: the keys
	// etcd wrote (a chunk each, nearly all), and the CPU an event.
	t.Logf("etcd puts %.0f/s (%.1f events each); CPU %.1f µs an event delivered",
		(puts1-puts0)/window, float64(len(all))/(puts1-puts0), float64((cpu1-cpu0).Microseconds())/float64(len(all)))
	t.Logf("CPU %.1f µs a chunk (etcd put); goroutines runnable before they run: p50 %s p99 %s p99.9 %s; GC pauses %d, p99 %s, max %s",
		float64((cpu1-cpu0).Microseconds())/(puts1-puts0), sched.quantile(0.5), sched.quantile(0.99), sched.quantile(0.999),
		gcp.total(), gcp.quantile(0.99), gcp.quantile(1))
}

// hist is a runtime/metrics histogram.
type hist struct{ h *metrics.Float64Histogram }

// runtimeHist reads the runtime's histogram name.
func runtimeHist(name string) hist {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	h := s[0].Value.Float64Histogram()
	return hist{&metrics.Float64Histogram{Counts: slices.Clone(h.Counts), Buckets: h.Buckets}}
}

// since is h less the counts of h0, read before.
func (h hist) since(h0 hist) hist {
	for i := range h.h.Counts {
		h.h.Counts[i] -= h0.h.Counts[i]
	}
	return h
}

func (h hist) total() uint64 {
	var n uint64
	for _, c := range h.h.Counts {
		n += c
	}
	return n
}

// quantile is the upper bound of the bucket of quantile q.
func (h hist) quantile(q float64) time.Duration {
	n := h.total()
	if n == 0 {
		return 0
	}
	want, seen := uint64(q*float64(n)), uint64(0)
	for i, c := range h.h.Counts {
		seen += c
		if seen > want || seen == n {
			return time.Duration(h.h.Buckets[i+1] * float64(time.Second)).Round(time.Microsecond)
		}
	}
	return 0
}

// startProfile starts a CPU profile of the measured window in dir
// (cpu.pprof), if dir is set, and returns what ends it and writes the
// allocations (allocs.pprof) and the GC's figures of the window.
func startProfile(t *testing.T, dir string) (stop func()) {
	t.Helper()
	if dir == "" {
		return func() {}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		t.Fatal(err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		t.Fatal(err)
	}
	var m0 runtime.MemStats
	runtime.ReadMemStats(&m0)
	return func() {
		pprof.StopCPUProfile()
		_ = f.Close()
		var m1 runtime.MemStats
		runtime.ReadMemStats(&m1)
		var pauses []time.Duration
		for i := m0.NumGC; i < m1.NumGC && i < m0.NumGC+256; i++ {
			pauses = append(pauses, time.Duration(m1.PauseNs[i%256]))
		}
		slices.Sort(pauses)
		maxPause := time.Duration(0)
		if len(pauses) > 0 {
			maxPause = pauses[len(pauses)-1]
		}
		t.Logf("profile: %d GCs, %.1f GB allocated (%d objects), GC CPU fraction %.3f, longest pause %s",
			m1.NumGC-m0.NumGC, float64(m1.TotalAlloc-m0.TotalAlloc)/1e9, m1.Mallocs-m0.Mallocs, m1.GCCPUFraction, maxPause)
		a, err := os.Create(filepath.Join(dir, "allocs.pprof"))
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		if err := pprof.Lookup("allocs").WriteTo(a, 0); err != nil {
			t.Fatal(err)
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchClaims takes n claim keys under one lease.
func benchClaims(t *testing.T, cli *clientv3.Client, keys keyspace.Space, n int) []stream.Claim {
	t.Helper()
	ctx := context.Background()
	l, err := cli.Grant(ctx, 600)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]stream.Claim, n)
	for i := range n {
		id := "task-" + strconv.Itoa(i)
		key := keys.Root() + "claims/" + id
		r, err := cli.Put(ctx, key, "", clientv3.WithLease(l.ID))
		if err != nil {
			t.Fatal(err)
		}
		out[i] = stream.Claim{Task: id, Attempt: 1, Worker: "bench", Fence: &keyClaim{key: key, token: r.Header.Revision, lease: l.ID}}
	}
	return out
}

// metric reads counter name from es's metrics.
func metric(t *testing.T, es *etcdtest.Server, name string) float64 {
	t.Helper()
	resp, err := http.Get(es.ClientURL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	for sc := bufio.NewScanner(resp.Body); sc.Scan(); {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			f, _ := strconv.ParseFloat(v, 64)
			return f
		}
	}
	return 0
}

// processCPU is the CPU time the process used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// TestFollowersReconnectAtOnce measures a thousand followers of one
// stream coming back at once: with DROVER_BENCH_RECONNECT=N it stores
// 2,000 events (in chunks of 20), then starts N followers together, each
// from a random event (as EventSource does with Last-Event-ID), while the
// stream goes on, and logs the time until every one has the stream's
// last event; it fails on any gap or duplicate.
func TestFollowersReconnectAtOnce(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_RECONNECT"))
	if n <= 0 {
		t.Skip("set DROVER_BENCH_RECONNECT=1000 to measure")
	}
	es, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Stop()
	cli := es.Client(t)
	keys := keyspace.MustNew("bench")
	ctx := context.Background()
	a := benchClaims(t, cli, keys, 1)[0]
	w := stream.NewWriter(cli, keys, stream.Limits{}, 0)
	batch := make([]stream.Input, 20)
	for i := range batch {
		batch[i] = stream.Input{Type: "token", Data: json.RawMessage(`{"text":"token"}`)}
	}
	var last int64
	for range 100 {
		if _, last, err = w.Append(ctx, a, batch); err != nil {
			t.Fatal(err)
		}
	}
	hub := stream.NewHub(es.Client(t), keys)
	final := last + 20 // one more batch, written while they reconnect
	began := time.Now()
	var wg sync.WaitGroup
	took := make([]time.Duration, n)
	for i := range n {
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, time.Minute)
			defer cancel()
			next := 1 + rand.Int64N(last)
			for ev, err := range hub.Follow(fctx, a.Task, next) {
				if err != nil {
					t.Errorf("follower %d: %v", i, err)
					return
				}
				if ev.Seq != next {
					t.Errorf("follower %d: seq %d, want %d (a gap or a duplicate)", i, ev.Seq, next)
					return
				}
				next++
				if ev.Seq == final {
					took[i] = time.Since(began)
					return
				}
			}
		})
	}
	if _, _, err := w.Append(ctx, a, batch); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	slices.Sort(took)
	t.Logf("%d followers of one stream of %d events, each from a random event, at once: all caught up (the last event, written meanwhile) after %s (p50 %s); hub watches opened %d",
		n, final, took[n-1].Round(time.Millisecond), took[n/2].Round(time.Millisecond), hub.Opened())
}

// TestChunkCost measures what one chunk costs the process, end to end
// (the writer's batch, etcd's write, apply and watch, the hub's
// delivery), as CPU time, which depends less on the machine's other
// load than latency does: with DROVER_BENCH_CHUNKS=N, N streams each
// write DROVER_BENCH_CHUNKS_ROUNDS (default 20) events one at a time,
// waiting for each (a chunk each), while a follower of each reads
// them, and it logs the process's CPU per chunk and per transaction.
func TestChunkCost(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_CHUNKS"))
	if n <= 0 {
		t.Skip("set DROVER_BENCH_CHUNKS=1000 to measure")
	}
	rounds := envInt("DROVER_BENCH_CHUNKS_ROUNDS", 20)
	es, err := etcdtest.Start(etcdtest.Options{Fsync: true})
	if err != nil {
		t.Fatal(err)
	}
	defer es.Stop()
	wcli, fcli := es.Client(t), es.Client(t)
	keys := keyspace.MustNew("bench")
	ctx := context.Background()
	claims := benchClaims(t, wcli, keys, n)
	w := stream.NewWriter(wcli, keys, stream.Limits{}, 0)
	hub := stream.NewHub(fcli, keys)
	data := []stream.Input{{Type: "token", Data: json.RawMessage(`{"text":"token"}`)}}
	for i := range n { // the attempts' first writes (attempt_started), not measured
		if _, _, err := w.Append(ctx, claims[i], data); err != nil {
			t.Fatal(err)
		}
	}
	tx0, puts0, cpu0, began := w.Transactions(), metric(t, es, "etcd_mvcc_put_total"), processCPU(), time.Now()
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			fctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
			defer cancel()
			for ev, err := range hub.Follow(fctx, claims[i].Task, 3) {
				if err != nil || ev.Seq == int64(2+rounds) {
					return
				}
			}
		})
		wg.Go(func() {
			for range rounds {
				if _, _, err := w.Append(ctx, claims[i], data); err != nil {
					t.Errorf("stream %d: %v", i, err)
					return
				}
			}
		})
	}
	wg.Wait()
	took, cpu := time.Since(began), processCPU()-cpu0
	tx, puts := w.Transactions()-tx0, metric(t, es, "etcd_mvcc_put_total")-puts0
	t.Logf("%d streams x %d chunks of 1 event, written and followed: %s, %d transactions, %.0f etcd puts; CPU %.1f µs a chunk, %.1f ms a transaction (%.2f cores)",
		n, rounds, took.Round(time.Millisecond), tx, puts, float64(cpu.Microseconds())/float64(n*rounds),
		float64(cpu.Microseconds())/1000/float64(tx), cpu.Seconds()/took.Seconds())
}
