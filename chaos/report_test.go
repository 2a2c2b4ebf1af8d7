package chaos

import (
	"encoding/json"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
)

// queueReport is the outcome of a chaos run of the queue.
type queueReport struct {
	cfg          queueConfig
	members      int
	took         time.Duration
	stats        queue.Stats
	listed       int
	badLines     int
	faults       []fault
	outages      []outage
	pausedFenced int // outcomes of paused workers that etcd refused (their --json "fenced")
	findings     queueFindings
	takeovers    map[faultKind]*takeover
}

// faultCounts counts the faults injected by kind; consequences counts
// what followed from them (workers that lost their lease by themselves).
func faultCounts(fs []fault) (injected, consequences map[faultKind]int) {
	injected, consequences = map[faultKind]int{}, map[faultKind]int{}
	for _, f := range fs {
		if f.kind == faultOutageExit || f.kind == faultSelfExit {
			consequences[f.kind]++
		} else {
			injected[f.kind]++
		}
	}
	return injected, consequences
}

// injectedCounts counts the faults injected by kind.
func injectedCounts(fs []fault) map[faultKind]int {
	in, _ := faultCounts(fs)
	return in
}

// fail reports every broken guarantee as a test error.
func (r *queueReport) fail(t *testing.T) {
	t.Helper()
	f := r.findings
	for _, c := range []struct {
		what string
		list []string
	}{
		{"tasks acknowledged twice", f.ackedTwice},
		{"tasks whose state and stored success disagree", f.notAcked},
		{"successes stored from an attempt that was not the task's last", f.ackNotLast},
		{"successes stored for attempts no worker logged", f.ackNoRun},
		{"attempt numbers started by two workers", f.dupAttempt},
		{"late acknowledgements of a paused worker accepted", f.lateAccepted},
		{"attempts run again although no fault hit their worker", f.unexplained},
		{"attempts a worker started after waking from a pause past its TTL", f.staleStarts},
	} {
		if len(c.list) > 0 {
			t.Errorf("%d %s, e.g. %v", len(c.list), c.what, first(c.list))
		}
	}
	if r.stats.Succeeded != int64(r.cfg.tasks) {
		t.Errorf("%d of %d tasks SUCCEEDED (stats %+v); with a budget of 20 retries every task should", r.stats.Succeeded, r.cfg.tasks, r.stats)
	}
	if r.badLines > 0 {
		t.Errorf("%d lines of the attempts log could not be read", r.badLines)
	}
	counts, _ := faultCounts(r.faults)
	if counts[faultServerKill]+counts[faultLeaderKill] == 0 || (!r.cfg.leaderOnly && (counts[faultWorkerKill] == 0 || counts[faultWorkerPause] == 0)) {
		t.Errorf("faults injected %v: want worker kills, a pause and a server kill", counts)
	}
	if f.lateRefused == 0 && !r.cfg.leaderOnly {
		t.Errorf("the paused worker finished no work during its pause: no late acknowledgement was tested")
	}
	// The goal is every task within TTL + 1 s; the test holds the median
	// of the first task per kill to it, which a loaded machine keeps, and
	// print shows the tasks that missed the goal.
	if k := r.takeovers[faultWorkerKill]; k != nil && quantile(k.firsts, 0.5) > r.cfg.ttl+time.Second {
		t.Errorf("median takeover after a worker SIGKILL %s, want within TTL + 1 s (%s)", quantile(k.firsts, 0.5), r.cfg.ttl+time.Second)
	}
}

// print logs the figures of the run.
func (r *queueReport) print(t *testing.T) {
	t.Helper()
	f := r.findings
	t.Logf("queue chaos, %d member(s): %d tasks, %d workers x concurrency %d, TTL %s, %s per attempt; took %s",
		r.members, r.cfg.tasks, r.cfg.workers, r.cfg.concurrency, r.cfg.ttl, r.cfg.taskTime, r.took.Round(time.Millisecond))
	injected, consequences := faultCounts(r.faults)
	t.Logf("faults injected: %v; then: %v", injected, consequences)
	t.Logf("stats: %+v (sum %d); %d tasks listed, each in one state", r.stats, r.stats.Total(), r.listed)
	t.Logf("attempts %d; tasks re-executed %d (%d extra attempts); extra attempts by fault: %v; unexplained %d",
		f.attempts, f.reexecuted, f.extraRuns, f.explained, len(f.unexplained))
	t.Logf("acknowledged twice %d; late acknowledgements refused %d (by etcd's fence: %d, the rest by the worker's own lease check), accepted %d",
		len(f.ackedTwice), f.lateRefused, r.pausedFenced, len(f.lateAccepted))

	for kind, k := range r.takeovers {
		if len(k.tasks) == 0 {
			continue
		}
		t.Logf("takeover after %s: %d tasks, median %s, p99 %s, max %s; first task per fault: median %s, max %s",
			kind, len(k.tasks), round(quantile(k.tasks, 0.5)), round(quantile(k.tasks, 0.99)), round(k.tasks[len(k.tasks)-1]),
			round(quantile(k.firsts, 0.5)), round(k.firsts[len(k.firsts)-1]))
		if kind == faultWorkerKill || kind == faultWorkerPause {
			for _, s := range first(k.slow) {
				t.Logf("takeover over the goal of TTL + 1 s after %s: %s", kind, s)
			}
		}
	}
	for _, o := range r.outages {
		if o.elected.IsZero() {
			t.Logf("server %s: killed, serving again %s later", o.member, round(o.ready.Sub(o.killed)))
		} else {
			t.Logf("leader %s killed: new leader in %s; the old leader served again %s after its kill",
				o.member, round(o.elected.Sub(o.killed)), round(o.ready.Sub(o.killed)))
		}
	}
}

// figures is the run's figures as JSON-ready values.
func (r *queueReport) figures() map[string]any {
	f := r.findings
	kinds, then := map[string]int{}, map[string]int{}
	injected, consequences := faultCounts(r.faults)
	for k, n := range injected {
		kinds[string(k)] = n
	}
	for k, n := range consequences {
		then[string(k)] = n
	}
	tk := map[string]map[string]string{}
	for kind, k := range r.takeovers {
		if len(k.tasks) > 0 {
			tk[string(kind)] = map[string]string{"tasks": strconv.Itoa(len(k.tasks)), "over_goal": strconv.Itoa(len(k.slow)),
				"median": round(quantile(k.tasks, 0.5)).String(),
				"p99":    round(quantile(k.tasks, 0.99)).String(), "max": round(k.tasks[len(k.tasks)-1]).String()}
		}
	}
	var outages []map[string]string
	for _, o := range r.outages {
		m := map[string]string{"member": o.member, "serving_again": round(o.ready.Sub(o.killed)).String()}
		if !o.elected.IsZero() {
			m["new_leader"] = round(o.elected.Sub(o.killed)).String()
		}
		outages = append(outages, m)
	}
	return map[string]any{"members": r.members, "tasks": r.cfg.tasks, "took": round(r.took).String(), "ttl": r.cfg.ttl.String(),
		"faults": kinds, "then": then, "stats": r.stats, "attempts": f.attempts, "reexecuted": f.reexecuted, "extra_attempts": f.extraRuns,
		"acked_twice": len(f.ackedTwice), "lost": len(f.notAcked), "late_acks_refused": f.lateRefused,
		"late_acks_fenced_by_etcd": r.pausedFenced, "late_acks_accepted": len(f.lateAccepted),
		"unexplained": len(f.unexplained), "stale_starts_after_pause": len(f.staleStarts), "takeover": tk, "outages": outages}
}

// round rounds a duration for reports.
func round(d time.Duration) time.Duration { return d.Round(10 * time.Millisecond) }

// writeFigures appends a run's figures, as one JSON line, to the file
// $DROVER_CHAOS_REPORT names (nothing when it is unset).
func writeFigures(t *testing.T, name string, figs map[string]any) {
	t.Helper()
	path := os.Getenv("DROVER_CHAOS_REPORT")
	if path == "" {
		return
	}
	figs["test"], figs["name"], figs["long"], figs["at"] = t.Name(), name, long(), time.Now().UTC().Format(time.RFC3339)
	b, err := json.Marshal(figs)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
}
