package cli_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/droverhq/drover/cmd/drover/internal/cli"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape reads a /metrics page.
func scrape(t *testing.T, addr string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	return fams
}

// sum adds the values of a family's series whose labels include want.
func sum(f *dto.MetricFamily, want map[string]string) float64 {
	if f == nil {
		return -1
	}
	var total float64
	for _, m := range f.Metric {
		ok := true
		for k, v := range want {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			total += m.Counter.GetValue()
		case m.Gauge != nil:
			total += m.Gauge.GetValue()
		case m.Histogram != nil:
			total += float64(m.Histogram.GetSampleCount())
		}
	}
	return total
}

func TestWorkerMetrics(t *testing.T) {
	ns := etcdtest.Namespace(t)
	for i := range 20 {
		if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "m", "--type", "ok", "--id", fmt.Sprintf("ok-%d", i))...); r.code != 0 {
			t.Fatal(r.stderr)
		}
	}
	for i := range 5 {
		if r := drover(t, append(etcdFlags(ns), "submit", "--queue", "m", "--type", "bad", "--id", fmt.Sprintf("bad-%d", i))...); r.code != 0 {
			t.Fatal(r.stderr)
		}
	}
	addr := etcdtest.FreeAddr()
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "m", "--metrics-listen", addr, "--depth-interval", "300ms",
		"--limit", "api=1000/s", "--quota", "tenant=5", "--breaker", "crm;failures=100",
		"--handler", `exec:if grep -q '"task_type":"bad"'; then exit 65; fi`)...)
	var fams map[string]*dto.MetricFamily
	waitFor(t, 30*time.Second, "all 25 tasks in the metrics", func() bool {
		select {
		case <-w.done:
			t.Fatalf("worker exited: %s", w.stderr.String())
		default:
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return false
		}
		resp.Body.Close()
		fams = scrape(t, addr)
		// The depth gauges are counted every 300 ms: wait for a count
		// taken after the last task finished.
		return sum(fams["drover_tasks_succeeded_total"], nil) == 20 && sum(fams["drover_tasks_dead_total"], nil) == 5 &&
			sum(fams["drover_queue_tasks"], map[string]string{"state": "succeeded"}) == 20 &&
			sum(fams["drover_queue_tasks"], map[string]string{"state": "dead"}) == 5 &&
			sum(fams["drover_queue_tasks"], map[string]string{"state": "pending"}) == 0
	})
	for _, c := range []struct {
		family string
		labels map[string]string
		want   float64
	}{
		{"drover_tasks_claimed_total", map[string]string{"queue": "m"}, 25},
		{"drover_tasks_claimed_total", map[string]string{"type": "ok"}, 20},
		{"drover_tasks_succeeded_total", map[string]string{"queue": "m", "type": "ok"}, 20},
		{"drover_tasks_failed_total", map[string]string{"type": "bad"}, 5},
		{"drover_tasks_dead_total", map[string]string{"type": "bad"}, 5},
		{"drover_task_duration_seconds", map[string]string{"queue": "m"}, 25},
		{"drover_task_duration_seconds", map[string]string{"outcome": "failed"}, 5},
		{"drover_queue_tasks", map[string]string{"queue": "m", "state": "dead"}, 5},
		{"drover_queue_tasks", map[string]string{"queue": "m", "state": "pending"}, 0},
		{"drover_lease_losses_total", nil, 0},
		{"drover_ratelimit_tokens_used_total", map[string]string{"limit": "api"}, 25},
		{"drover_ratelimit_waits_total", map[string]string{"limit": "api"}, 0},
		{"drover_quota_waits_total", map[string]string{"quota": "tenant"}, 0},
		{"drover_breaker_state", map[string]string{"breaker": "crm"}, 0},
	} {
		if got := sum(fams[c.family], c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.family, c.labels, got, c.want)
		}
	}
	for _, c := range []struct {
		family string
		labels map[string]string
	}{
		{"drover_claim_batch_size", map[string]string{"queue": "m"}},
		{"drover_etcd_txn_duration_seconds", map[string]string{"op": "claim"}},
		{"drover_etcd_txn_duration_seconds", map[string]string{"op": "ack"}},
		{"go_goroutines", nil},
		{"process_resident_memory_bytes", nil},
	} {
		if got := sum(fams[c.family], c.labels); got <= 0 {
			t.Errorf("%s%v = %v, want > 0", c.family, c.labels, got)
		}
	}
	if fams["drover_claim_batch_size"] != nil && sum(fams["drover_claim_batch_size"], nil) > 25 {
		t.Errorf("more claim transactions (%v) than tasks", sum(fams["drover_claim_batch_size"], nil))
	}
	for name := range fams {
		if strings.HasPrefix(name, "drover_") && fams[name].GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}
}

func TestServerMetrics(t *testing.T) {
	dir := t.TempDir()
	addr := etcdtest.FreeAddr()
	var env []string // without $GOGC, so the server's own default shows
	for _, kv := range cleanEnv() {
		if !strings.HasPrefix(kv, "GOGC=") {
			env = append(env, kv)
		}
	}
	p := startIn(t, dir, env, "server", "--data-dir", dir+"/data", "--etcd-listen", "http://"+etcdtest.FreeAddr(),
		"--etcd-peer-listen", "http://"+etcdtest.FreeAddr(), "--metrics-listen", addr)
	waitFor(t, 30*time.Second, "the server", func() bool { return strings.Contains(p.stderr.String(), "drover server ready") })
	fams := scrape(t, addr)
	for _, name := range []string{"drover_lease_losses_total", "etcd_server_has_leader", "etcd_mvcc_db_total_size_in_bytes", "go_goroutines"} {
		if fams[name] == nil {
			t.Errorf("server /metrics lacks %s", name)
		}
	}
	if v := sum(fams["etcd_server_has_leader"], nil); v != 1 {
		t.Errorf("etcd_server_has_leader = %v", v)
	}
	if v := sum(fams["go_gc_gogc_percent"], nil); v != cli.DefaultServerGCPercent {
		t.Errorf("go_gc_gogc_percent = %v, want the server's default %d", v, cli.DefaultServerGCPercent)
	}
	resp, err := http.Get("http://" + addr + "/debug/pprof/goroutine?debug=1")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("profiles not served on the metrics address: %v %v", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
	// A busy address is refused with the flag named.
	r := drover(t, "server", "--data-dir", dir+"/other", "--metrics-listen", addr)
	if r.code != 2 || !strings.Contains(r.stderr, "--metrics-listen") {
		t.Errorf("busy metrics address: exit %d %s", r.code, r.stderr)
	}
}
