package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/queue"
	"github.com/prometheus/client_golang/prometheus/testutil"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TestDelayedAtScale is the delayed tasks' measurement at the scale the
// design is for. By default it is a short run CI makes (2,000 tasks due
// over 2 s, an embedded etcd): every task is claimed, none early. With
// DROVER_BENCH_SCALE=N (DROVER_BENCH_SCALE_WINDOW, default 60s) it submits
// N tasks due at random times over the window, 10,000 a request; with
// DROVER_BIN set to a drover binary, into a `drover server` process
// (embedded etcd, fsync on), else an embedded etcd in this process. Two
// workers of concurrency 64 are idle and ready before the window opens.
// It reports the etcd bytes (keys and values) stored per scheduled task;
// with DROVER_BIN, the server process's CPU (utime and stime of
// /proc/PID/stat) over DROVER_BENCH_SCALE_CPU (default 30s) while every
// task waits and none is due, and the CPU of the server and of this
// process (the workers) per task claimed from the window's start to the
// last ack; and how late each task is claimed (p50, p99, max). It fails
// if a task is claimed early, asserting no time bound.
// DROVER_BENCH_SCALE_LEAD overrides how long after the submission starts
// the window opens (default 3 s + 1 s per 4,000 tasks + the CPU window).
// DROVER_BENCH_SCALE_OPS logs what the workers sent to etcd from the
// window's start to the last ack, per task (countOps);
// DROVER_BENCH_SCALE_PROFILE profiles the claims (profileWindow).
// DROVER_BENCH_SCALE_NOW=1 measures instead the ceiling any due index is
// bound by: the same server and workers on tasks due now (delayedCeiling).
func TestDelayedAtScale(t *testing.T) {
	if os.Getenv("DROVER_BENCH_SCALE_NOW") != "" {
		delayedCeiling(t)
		return
	}
	n, window, cpuWindow := 2000, 2*time.Second, time.Duration(0)
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE")); v > 0 {
		n, window = v, time.Minute
	}
	if v, err := time.ParseDuration(os.Getenv("DROVER_BENCH_SCALE_WINDOW")); err == nil {
		window = v
	}
	var cli *clientv3.Client
	pid := 0
	if bin := os.Getenv("DROVER_BIN"); bin != "" && os.Getenv("DROVER_BENCH_SCALE") != "" {
		cli, pid = startServerProcess(t, bin, "bench")
		cpuWindow = 30 * time.Second
		if v, err := time.ParseDuration(os.Getenv("DROVER_BENCH_SCALE_CPU")); err == nil {
			cpuWindow = v
		}
	} else {
		s, err := etcdtest.Start(etcdtest.Options{Fsync: true})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Stop()
		cli = s.Client(t)
	}
	c, err := queue.NewClient(cli, "bench")
	if err != nil {
		t.Fatal(err)
	}
	lead := 3*time.Second + time.Duration(n/4000)*time.Second + cpuWindow
	if v, err := time.ParseDuration(os.Getenv("DROVER_BENCH_SCALE_LEAD")); err == nil {
		lead = v
	}
	start := time.Now().Add(lead)
	submitted := submitSpread(t, c, n, start, window)
	bytes, keys := storedBytes(t, cli, "/bench/queues/later/")
	segBytes, segKeys := storedBytes(t, cli, "/bench/segments/later/")
	idBytes, idKeys := storedBytes(t, cli, "/bench/ids/")
	bytes, keys = bytes+segBytes+idBytes, keys+segKeys+idKeys
	st, _ := c.Stats(context.Background(), "later")
	t.Logf("%d tasks due over %v from %v on, submitted in %v (%d scheduled): %d keys, %.0f etcd bytes per task",
		n, window, lead, submitted.Round(time.Millisecond), st.Scheduled, keys, float64(bytes)/float64(n))
	opsReset, opsLog := countOps(t, cli, "bench")
	wait := startDelayedWorkers(t, cli, "bench", n, start.Add(window+tail(n)))
	profileWindow(t, start, window+10*time.Second)
	if pid != 0 {
		if time.Until(start) < cpuWindow+time.Second {
			t.Fatalf("the submission took %v: no time is left for the CPU window before the tasks fall due; raise DROVER_BENCH_SCALE_LEAD", submitted)
		}
		time.Sleep(time.Second) // the workers' first reads
		a := processCPU(t, pid)
		began := time.Now()
		time.Sleep(cpuWindow)
		t.Logf("server CPU while all wait and none is due: %.2f %% of a core over %v", 100*(processCPU(t, pid)-a).Seconds()/time.Since(began).Seconds(), cpuWindow)
		dueReadCost(t, cli, c, pid)
	}
	var cpu0, own0 time.Duration
	if pid != 0 || opsReset != nil {
		time.Sleep(time.Until(start))
	}
	if pid != 0 {
		cpu0, own0 = processCPU(t, pid), processCPU(t, os.Getpid())
	}
	if opsReset != nil {
		opsReset()
	}
	lateness := wait()
	if opsLog != nil && len(lateness) > 0 {
		opsLog(len(lateness))
	}
	if pid != 0 && len(lateness) > 0 {
		// From the window's start to the last claim's ack: the moves,
		// claims and acks, per task claimed.
		srv, own := processCPU(t, pid)-cpu0, processCPU(t, os.Getpid())-own0
		per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(len(lateness)) }
		t.Logf("CPU a task claimed, from the window's start to the last ack: server %.1f µs, workers %.1f µs, both %.1f µs (%v and %v over %d tasks)",
			per(srv), per(own), per(srv+own), srv, own, len(lateness))
	}
	slices.Sort(lateness)
	moves := func(r string) float64 { return testutil.ToFloat64(metrics.DueMoves.WithLabelValues("scheduled", r)) }
	t.Logf("the workers' due moves: %.0f gathered, %.0f lost, %.0f one by one; %.0f errors",
		moves("gathered"), moves("lost"), moves("one-by-one"), testutil.ToFloat64(metrics.DueErrors.WithLabelValues("scheduled")))
	if g, err := cli.Get(context.Background(), "/bench/segments/later/", clientv3.WithPrefix(), clientv3.WithCountOnly()); err == nil && g.Count > 0 {
		// The moves gather a due batch's small segments into full ones.
		t.Logf("segment records: %d while scheduled (%.1f tasks each), %d after the window", segKeys, float64(n)/float64(segKeys), g.Count)
	}
	if len(lateness) < n && os.Getenv("DROVER_BENCH_SCALE") == "" {
		t.Fatalf("only %d of %d tasks claimed %v after the window's end", len(lateness), n, tail(n))
	}
	if len(lateness) < n {
		t.Logf("only %d of %d tasks claimed %v after the window's end", len(lateness), n, tail(n))
	}
	if len(lateness) == 0 {
		t.Fatal("no task claimed")
	}
	pct := func(p float64) time.Duration {
		return lateness[min(len(lateness)-1, int(p*float64(len(lateness))))].Round(time.Millisecond)
	}
	t.Logf("%d claimed, late by p50 %v, p99 %v, max %v; early: %d", len(lateness), pct(0.5), pct(0.99), lateness[len(lateness)-1].Round(time.Millisecond), early(lateness))
	if e := early(lateness); e > 0 {
		t.Fatalf("%d tasks claimed before their time", e)
	}
}

// dueReadCost logs what counting the scheduled tasks costs the server
// process pid (CPU and time): a Stats of the queue, whose due keys it reads
// keys only (the count is in their names), and a count-only read of the
// same keys (what a count that did not read them would cost).
func dueReadCost(t *testing.T, cli *clientv3.Client, c *queue.Client, pid int) {
	t.Helper()
	ctx := context.Background()
	for _, r := range []struct {
		name string
		read func() error
	}{
		{"Stats (due keys read keys only)", func() error { _, err := c.Stats(ctx, "later"); return err }},
		{"count-only read of the due keys", func() error {
			_, err := cli.Get(ctx, "/bench/queues/later/due/", clientv3.WithPrefix(), clientv3.WithCountOnly())
			return err
		}},
	} {
		a, began := processCPU(t, pid), time.Now()
		for range 5 {
			if err := r.read(); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %v and %v of the server's CPU each", r.name, (time.Since(began) / 5).Round(time.Millisecond), ((processCPU(t, pid) - a) / 5).Round(time.Millisecond))
	}
}

// tail is how long after the window's end the measurement waits for the
// claims of n tasks at most (DROVER_BENCH_SCALE_TAIL, default 3 minutes).
func tail(n int) time.Duration {
	if d, err := time.ParseDuration(os.Getenv("DROVER_BENCH_SCALE_TAIL")); err == nil {
		return d
	}
	return 3*time.Minute + time.Duration(n/1000)*time.Millisecond
}

// submitSpread submits n tasks to queue "later" due at random times over
// window from start, 10,000 a request (DROVER_BENCH_SCALE_REQUEST: a
// shorter run with the segments of a longer one; in parallel, two
// requests at a time), each with its due time in its parameters, and returns how long
// that took; it fails if the submission ran past start.
func submitSpread(t *testing.T, c *queue.Client, n int, start time.Time, window time.Duration) time.Duration {
	t.Helper()
	began := time.Now()
	per := 10000
	if v, _ := strconv.Atoi(os.Getenv("DROVER_BENCH_SCALE_REQUEST")); v > 0 {
		per = v
	}
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for part := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(part), 7))
			for from := part * per; from < n; from += 2 * per {
				in := make([]queue.Task, 0, per)
				for i := from; i < min(from+per, n); i++ {
					due := start.Add(time.Duration(rng.Int64N(int64(window))))
					in = append(in, queue.Task{ID: fmt.Sprintf("t%08d", i), Type: "noop", RunAt: due,
						Parameters: json.RawMessage(strconv.FormatInt(due.UnixNano(), 10))})
				}
				if _, err := c.Submit(context.Background(), "later", in, nil); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	took := time.Since(began)
	switch {
	case !time.Now().After(start):
	case os.Getenv("DROVER_BENCH_SCALE") != "":
		// A measurement whose tasks fell due while still being submitted
		// would report the submission's pace, not the claims'.
		t.Fatalf("the submission took %v, past the window's start: raise the lead (DROVER_BENCH_SCALE_LEAD)", took)
	default:
		// The short run asserts only that every task is claimed and none
		// early, which holds however busy the machine made the submission.
		t.Logf("the submission took %v, past the window's start (a busy machine)", took)
	}
	return took
}

// startServerProcess starts `drover server` (bin) with an embedded etcd of
// its own on free loopback ports, serving namespace ns, and returns a
// client of its etcd and its process id; it is stopped when the test ends.
func startServerProcess(t *testing.T, bin, ns string) (*clientv3.Client, int) {
	t.Helper()
	free := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	}
	etcdPort := free()
	var stderr lockedBuffer
	cmd := exec.Command(bin, "server", "--data-dir", filepath.Join(t.TempDir(), "data"), "--namespace", ns,
		"--etcd-listen", "http://127.0.0.1:"+etcdPort, "--etcd-peer-listen", "http://127.0.0.1:"+free(), "--http-listen", "127.0.0.1:"+free())
	if addr := os.Getenv("DROVER_BENCH_SCALE_METRICS"); addr != "" {
		// /metrics and /debug/pprof/ of the server, to profile a run.
		cmd.Args = append(cmd.Args, "--metrics-listen", addr)
	}
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	if !etcdtest.Eventually(60*time.Second, func() bool { return strings.Contains(stderr.String(), "HTTP API ready") }) {
		t.Fatalf("the server did not start:\n%s", stderr.String())
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:" + etcdPort}, DialTimeout: 10 * time.Second,
		MaxCallSendMsgSize: 64 << 20, MaxCallRecvMsgSize: 256 << 20})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli, cmd.Process.Pid
}

// processCPU is the CPU time process pid has used, user and system, from
// /proc/PID/stat (clock ticks of 10 ms).
func processCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// lockedBuffer is a bytes.Buffer a process writes and a test reads at once.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }
