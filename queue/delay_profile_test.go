package queue_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/metrics"
	clientv3 "go.etcd.io/etcd/client/v3"
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

// opCounts counts what a client sends: round trips by method, and the
// operations they carry by kind (get, put, delete) and key family (ids,
// segments, segments/open, runs, tries, outs, exits, due, ...), nested
// transactions' Then included, an Else apart.
type opCounts struct {
	mu sync.Mutex
	n  map[string]int64
}

func (c *opCounts) add(k string, d int64) {
	c.mu.Lock()
	c.n[k] += d
	c.mu.Unlock()
}

// snapshot returns the counts and resets them.
func (c *opCounts) snapshot() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := c.n
	c.n = map[string]int64{}
	return out
}

// keyFamily names the family of a key under namespace ns.
func keyFamily(ns string, key []byte) string {
	parts := strings.Split(strings.TrimPrefix(string(key), "/"+ns+"/"), "/")
	if parts[0] != "queues" || len(parts) < 3 {
		return parts[0]
	}
	if parts[2] == "segments" && len(parts) > 3 && (parts[3] == "open" || parts[3] == "closed") {
		return "segments/" + parts[3]
	}
	return parts[2]
}

func (c *opCounts) ops(ns, branch string, ops []clientv3.Op) {
	for _, op := range ops {
		switch {
		case op.IsTxn():
			_, then, els := op.Txn()
			c.ops(ns, branch, then)
			c.ops(ns, "else ", els)
		case op.IsGet():
			c.add(branch+"get "+keyFamily(ns, op.KeyBytes()), 1)
		case op.IsPut():
			c.add(branch+"put "+keyFamily(ns, op.KeyBytes()), 1)
		case op.IsDelete():
			c.add(branch+"delete "+keyFamily(ns, op.KeyBytes()), 1)
		}
	}
}

// opKV is a clientv3.KV that counts into c what it sends.
type opKV struct {
	clientv3.KV
	ns string
	c  *opCounts
}

func (k opKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.c.add("round trip: get", 1)
	k.c.ops(k.ns, "", []clientv3.Op{clientv3.OpGet(key, opts...)})
	return k.KV.Get(ctx, key, opts...)
}

func (k opKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.c.add("round trip: put", 1)
	k.c.ops(k.ns, "", []clientv3.Op{clientv3.OpPut(key, val, opts...)})
	return k.KV.Put(ctx, key, val, opts...)
}

func (k opKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.c.add("round trip: delete", 1)
	k.c.ops(k.ns, "", []clientv3.Op{clientv3.OpDelete(key, opts...)})
	return k.KV.Delete(ctx, key, opts...)
}

func (k opKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.c.add("round trip: do", 1)
	k.c.ops(k.ns, "", []clientv3.Op{op})
	return k.KV.Do(ctx, op)
}

func (k opKV) Txn(ctx context.Context) clientv3.Txn {
	return &opTxn{Txn: k.KV.Txn(ctx), kv: k}
}

type opTxn struct {
	clientv3.Txn
	kv        opKV
	cmps      int
	then, els []clientv3.Op
}

func (t *opTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.cmps += len(cs)
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *opTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *opTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *opTxn) Commit() (*clientv3.TxnResponse, error) {
	t.kv.c.add("round trip: txn", 1)
	t.kv.c.add("compares (top level)", int64(t.cmps))
	t.kv.c.ops(t.kv.ns, "", t.then)
	t.kv.c.ops(t.kv.ns, "else ", t.els)
	return t.Txn.Commit()
}

// countOps makes cli count what it sends, when DROVER_BENCH_SCALE_OPS is
// set (call it before cli is shared): reset starts the count again, and
// log logs it per task claimed (both nil without the variable).
func countOps(t *testing.T, cli *clientv3.Client, ns string) (reset func(), log func(tasks int)) {
	if os.Getenv("DROVER_BENCH_SCALE_OPS") == "" {
		return nil, nil
	}
	c := &opCounts{n: map[string]int64{}}
	cli.KV = opKV{KV: cli.KV, ns: ns, c: c}
	return func() { c.snapshot() }, func(tasks int) {
		n := c.snapshot()
		keys := make([]string, 0, len(n))
		for k := range n {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var b strings.Builder
		for _, k := range keys {
			fmt.Fprintf(&b, "\n  %-28s %9d  %.3f a task", k, n[k], float64(n[k])/float64(tasks))
		}
		t.Logf("what the workers sent from the window's start to the last ack, over %d tasks:%s", tasks, b.String())
	}
}
