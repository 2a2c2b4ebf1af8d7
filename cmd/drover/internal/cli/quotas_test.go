package cli_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
)

// span is one task's run as its handler recorded it.
type span struct {
	start, end float64
	tenant     string
}

func spans(t *testing.T, path string) []span {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	open := map[string]float64{}
	var out []span
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kind, id, tenant string
		var ts float64
		if _, err := fmt.Sscan(sc.Text(), &kind, &ts, &id, &tenant); err != nil {
			continue
		}
		if kind == "start" {
			open[id] = ts
		} else if s, ok := open[id]; ok {
			out = append(out, span{s, ts, tenant})
			delete(open, id)
		}
	}
	return out
}

// peak is the most spans of tenant running at one instant.
func peak(ss []span, tenant string) int {
	type ev struct {
		at    float64
		delta int
	}
	var evs []ev
	for _, s := range ss {
		if s.tenant == tenant {
			evs = append(evs, ev{s.start, 1}, ev{s.end, -1})
		}
	}
	sort.Slice(evs, func(i, j int) bool {
		if evs[i].at != evs[j].at {
			return evs[i].at < evs[j].at
		}
		return evs[i].delta < evs[j].delta // an end before a start at the same instant
	})
	n, best := 0, 0
	for _, e := range evs {
		n += e.delta
		best = max(best, n)
	}
	return best
}

const recordSpan = `exec:in=$(cat); id=$(printf '%s' "$in" | sed 's/.*"task_id":"\([^"]*\)".*/\1/'); ` +
	`tn=$(printf '%s' "$in" | sed -n 's/.*"tenant":"\([^"]*\)".*/\1/p'); ` +
	`echo "start $(date +%s.%N) $id ${tn:--}" >> LOG; sleep SLEEP; echo "end $(date +%s.%N) $id ${tn:--}" >> LOG`

// TestTenantQuotaAcrossWorkers: three worker processes of concurrency 8
// share a quota of 2 for tenant acme (others have none). acme never has more than 2 tasks running
// (from the start and end times the handler records), globex is not held
// back, and no task is charged a retry for waiting.
func TestTenantQuotaAcrossWorkers(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "q", "acme", 16, `,"metadata":{"tenant":"acme"}`)
	submitN(t, ns, "q", "globex", 24, `,"metadata":{"tenant":"globex"}`)
	log := filepath.Join(t.TempDir(), "spans")
	handler := strings.NewReplacer("LOG", log, "SLEEP", "0.4").Replace(recordSpan)
	ws := startWorkers(t, ns, 3, "--queue", "q", "--concurrency", "8", "--drain",
		"--quota", "tenant:acme=2", "--handler", handler)
	waitWorkers(t, ws, 90*time.Second)
	ss := spans(t, log)
	if len(ss) != 40 {
		t.Fatalf("%d tasks ran, want 40", len(ss))
	}
	pa, pg := peak(ss, "acme"), peak(ss, "globex")
	t.Logf("peak running: acme %d (quota 2), globex %d", pa, pg)
	if pa > 2 {
		t.Fatalf("acme ran %d tasks at once under a quota of 2", pa)
	}
	if pa < 2 || pg < 6 {
		for _, s := range ss {
			t.Logf("%s %.3f-%.3f", s.tenant, s.start-ss[0].start, s.end-ss[0].start)
		}
		t.Fatalf("peaks acme %d, globex %d: the quota held back more than acme", pa, pg)
	}
	r := drover(t, append(etcdFlags(ns), "tasks", "list", "--queue", "q", "--status", "SUCCEEDED", "--limit", "100", "--json")...)
	var tasks []struct {
		ID      string `json:"task_id"`
		Retries int    `json:"retries_attempted"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &struct{ Tasks any }{&tasks}); err != nil || len(tasks) != 40 {
		t.Fatalf("tasks list: %d tasks, %v", len(tasks), err)
	}
	for _, tk := range tasks {
		if tk.Retries != 0 {
			t.Fatalf("task %s was charged %d retries for waiting on its quota", tk.ID, tk.Retries)
		}
	}
}

// TestQuotaSlotsFreedWhenWorkerDies kills a worker holding two slots with
// SIGKILL: they were on its 2 s lease, and are free again.
func TestQuotaSlotsFreedWhenWorkerDies(t *testing.T) {
	ns := etcdtest.Namespace(t)
	submitN(t, ns, "q", "acme", 2, `,"metadata":{"tenant":"acme"}`)
	log := filepath.Join(t.TempDir(), "spans")
	handler := strings.NewReplacer("LOG", log, "SLEEP", "60").Replace(recordSpan)
	w := start(t, cleanEnv(), append(etcdFlags(ns), "worker", "--queue", "q", "--ttl", "2s", "--quota", "tenant=2", "--handler", handler)...)
	held := func() int {
		r := drover(t, append(etcdFlags(ns), "quotas", "list", "--json")...)
		var qs []struct {
			Name  string         `json:"name"`
			Limit int            `json:"limit"`
			Held  map[string]int `json:"held"`
		}
		if err := json.Unmarshal([]byte(r.stdout), &qs); err != nil {
			t.Fatalf("quotas list: %q %v", r.stdout, err)
		}
		if len(qs) != 1 {
			return -1
		}
		return qs[0].Held["acme"]
	}
	waitFor(t, 60*time.Second, "two acme slots held", func() bool { return held() == 2 })
	// The slots live on the worker's 2 s lease: etcd frees them when it
	// expires. That is what the worker decides; when etcd gets round to it
	// on a busy machine is not, so the wait below only guards a hang.
	grants := grantedTTLs(t, keyspace.MustNew(ns).QuotaGrants("tenant", "acme"))
	if len(grants) != 1 { // one grant per worker, counting its slots
		t.Fatalf("acme's grants on a lease: %v, want the worker's one", grants)
	}
	for key, ttl := range grants {
		if ttl != 2 {
			t.Fatalf("%s is on a lease of %d s, want the worker's 2 s", key, ttl)
		}
	}
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	waitFor(t, 60*time.Second, "the slots to free", func() bool { return held() == 0 })
}
