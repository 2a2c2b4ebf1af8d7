package queue_test

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/metrics"
)

// profileWindow profiles a delayed-task run while its tasks fall due, when
// DROVER_BENCH_SCALE_PROFILE names a directory: from at (the window's
// start) for d, a CPU profile of this process (the workers) into
// workers.pprof and, with DROVER_BENCH_SCALE_METRICS, one of the server
// into server.pprof, and the server's etcd request counters before and
// after, logged as rates. It returns at once; the profiles end by
// themselves, and the test's cleanup waits for them.
func profileWindow(t *testing.T, at time.Time, d time.Duration) {
	t.Helper()
	dir := os.Getenv("DROVER_BENCH_SCALE_PROFILE")
	if dir == "" {
		return
	}
	addr := os.Getenv("DROVER_BENCH_SCALE_METRICS")
	// The claims may end before the profile does: the test waits for it.
	finished := make(chan struct{})
	t.Cleanup(func() { <-finished })
	go func() {
		defer close(finished)
		time.Sleep(time.Until(at))
		f, err := os.Create(filepath.Join(dir, "workers.pprof"))
		if err != nil {
			t.Logf("profile: %v", err)
			return
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			t.Logf("profile: %v", err)
			return
		}
		before, wbefore := etcdCounters(addr), workerCounters()
		done := make(chan struct{})
		if addr != "" {
			go func() {
				defer close(done)
				resp, err := http.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, int(d.Seconds())))
				if err != nil {
					return
				}
				defer resp.Body.Close()
				out, err := os.Create(filepath.Join(dir, "server.pprof"))
				if err != nil {
					return
				}
				defer out.Close()
				_, _ = io.Copy(out, resp.Body)
			}()
		} else {
			close(done)
		}
		began := time.Now()
		time.Sleep(d)
		pprof.StopCPUProfile()
		_ = f.Close()
		after, wafter := etcdCounters(addr), workerCounters()
		secs := time.Since(began).Seconds()
		var b strings.Builder
		for _, k := range []string{"etcd_mvcc_txn_total", "etcd_mvcc_range_total", "etcd_mvcc_put_total", "etcd_mvcc_delete_total", "etcd_debugging_mvcc_keys_total", "etcd_server_proposals_committed_total"} {
			fmt.Fprintf(&b, " %s %.0f/s", k, (after[k]-before[k])/secs)
		}
		for _, k := range []string{"etcd_disk_wal_fsync_duration_seconds", "etcd_disk_backend_commit_duration_seconds"} {
			if c := after[k+"_count"] - before[k+"_count"]; c > 0 {
				fmt.Fprintf(&b, " %s %.0f/s mean %.1f ms", k, c/secs, 1000*(after[k+"_sum"]-before[k+"_sum"])/c)
			}
		}
		t.Logf("etcd over the profile's %v:%s", d, b.String())
		b.Reset()
		for k, v := range wafter {
			if c, ok := strings.CutSuffix(k, "_count"); ok && v > wbefore[k] {
				fmt.Fprintf(&b, " %s %.0f/s mean %.4g;", c, (v-wbefore[k])/secs, (wafter[c+"_sum"]-wbefore[c+"_sum"])/(v-wbefore[k]))
			}
		}
		t.Logf("workers over the profile's %v:%s", d, b.String())
		<-done
	}()
}

// workerCounters reads this process's histograms and drover's counters
// (metrics.Registry) by name and label values: each one's _count (a
// counter's value) and _sum.
func workerCounters() map[string]float64 {
	m := map[string]float64{}
	mfs, err := metrics.Registry.Gather()
	if err != nil {
		return m
	}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			name := mf.GetName()
			for _, l := range mt.GetLabel() {
				name += "/" + l.GetValue()
			}
			if c := mt.GetCounter(); c != nil && strings.HasPrefix(name, "drover_") {
				m[name+"_count"] += c.GetValue()
				continue
			}
			h := mt.GetHistogram()
			if h == nil {
				continue
			}
			m[name+"_count"] += float64(h.GetSampleCount())
			m[name+"_sum"] += h.GetSampleSum()
		}
	}
	return m
}

// etcdCounters reads the server's /metrics at addr and sums each counter
// over its labels.
func etcdCounters(addr string) map[string]float64 {
	m := map[string]float64{}
	if addr == "" {
		return m
	}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return m
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		name, rest, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err == nil {
			m[name] += v
		}
	}
	return m
}
