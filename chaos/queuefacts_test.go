package chaos

import (
	"fmt"
	"slices"
	"time"

	"github.com/droverhq/drover/queue"
)

// queueFacts is what a chaos run of the queue left: each task's state, the
// attempts its workers logged, the acks etcd stored, the faults injected.
type queueFacts struct {
	states   map[string]queue.Status
	attempts map[string][]*attempt
	acks     map[string][]ack
	faults   []fault
}

// queueFindings is what analyze found in the facts.
type queueFindings struct {
	attempts     int               // attempts started
	reexecuted   int               // tasks started more than once
	extraRuns    int               // attempts beyond each task's first
	explained    map[faultKind]int // attempts that were run again, by the fault that hit their worker
	unexplained  []string          // attempts run again whose worker no fault hit
	ackedTwice   []string          // tasks with more than one success stored
	notAcked     []string          // SUCCEEDED without a stored success, or a success stored for a task in another state
	ackNotLast   []string          // the success stored is not from the task's last attempt
	ackNoRun     []string          // a success stored for an attempt no worker logged
	dupAttempt   []string          // one attempt number started by two workers
	lateRefused  int               // attempts a paused worker finished during its pause, whose success was refused
	lateAccepted []string          // ... whose success was stored
	staleStarts  []string          // attempts a paused worker started after its pause: its lease was gone
}

// accepted reports whether attempt a is the one whose success was stored.
func (f queueFacts) accepted(a *attempt) bool {
	ks := f.acks[a.id]
	return len(ks) > 0 && ks[0].n == a.n && ks[0].pid == a.pid
}

// hits indexes the faults by the worker pids they hit, in time order, and
// each paused worker's pause.
func (f queueFacts) hits() (map[int][]fault, map[int]fault) {
	hits, pauses := map[int][]fault{}, map[int]fault{}
	for _, ft := range f.faults {
		for _, pid := range ft.pids {
			hits[pid] = append(hits[pid], ft)
			if ft.kind == faultWorkerPause {
				pauses[pid] = ft
			}
		}
	}
	for _, fs := range hits {
		slices.SortFunc(fs, func(a, b fault) int { return a.at.Compare(b.at) })
	}
	return hits, pauses
}

// causeOf is the fault that ended attempt a: the first to hit its worker
// after it started; false when none did.
func causeOf(hits map[int][]fault, a *attempt) (fault, bool) {
	for _, ft := range hits[a.pid] {
		if ft.at.UnixNano() > a.start {
			return ft, true
		}
	}
	return fault{}, false
}

// analyze checks every task: one stored success for a SUCCEEDED task and
// none for any other, from the task's last attempt, which the worker
// logged; every earlier attempt run by a worker that a fault hit after the
// attempt started; no attempt number started twice; no success stored for
// work a paused worker finished after its pause began.
func analyze(f queueFacts) queueFindings {
	hits, pauses := f.hits()
	out := queueFindings{explained: map[faultKind]int{}}
	ids := make([]string, 0, len(f.states))
	for id := range f.states {
		ids = append(ids, id)
	}
	for id := range f.acks {
		if _, ok := f.states[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		as, ks := f.attempts[id], f.acks[id]
		out.attempts += len(as)
		switch st := f.states[id]; {
		case len(ks) > 1:
			out.ackedTwice = append(out.ackedTwice, fmt.Sprintf("%s: %v", id, ks))
		case st == queue.Succeeded && len(ks) == 0:
			out.notAcked = append(out.notAcked, id+": SUCCEEDED, no success stored")
		case st != queue.Succeeded && len(ks) > 0:
			out.notAcked = append(out.notAcked, fmt.Sprintf("%s: %s with a success stored", id, st))
		}
		seen, last := map[int]int{}, 0
		for _, a := range as {
			if pid, ok := seen[a.n]; ok && pid != a.pid {
				out.dupAttempt = append(out.dupAttempt, fmt.Sprintf("%s attempt %d: workers %d and %d", id, a.n, pid, a.pid))
			}
			seen[a.n], last = a.pid, max(last, a.n)
		}
		if len(ks) > 0 {
			k := ks[0]
			if pid, ok := seen[k.n]; !ok || pid != k.pid {
				out.ackNoRun = append(out.ackNoRun, fmt.Sprintf("%s: success of attempt %d by %d, never logged", id, k.n, k.pid))
			} else if k.n != last {
				out.ackNotLast = append(out.ackNotLast, fmt.Sprintf("%s: success of attempt %d, last attempt %d", id, k.n, last))
			}
		}
		if len(as) > 1 {
			out.reexecuted++
			out.extraRuns += len(as) - 1
		}
		for _, a := range as {
			acc := f.accepted(a)
			if p, ok := pauses[a.pid]; ok && a.end >= p.at.UnixNano() {
				if acc {
					out.lateAccepted = append(out.lateAccepted, fmt.Sprintf("%s attempt %d by paused worker %d", id, a.n, a.pid))
				} else {
					out.lateRefused++
				}
			}
			if p, ok := pauses[a.pid]; ok && a.start > p.at.UnixNano() {
				out.staleStarts = append(out.staleStarts, staleStart(a, as, p))
				continue
			}
			if acc || len(as) == 1 {
				continue
			}
			if ft, ok := causeOf(hits, a); ok {
				out.explained[ft.kind]++
			} else {
				out.unexplained = append(out.unexplained, fmt.Sprintf("%s attempt %d by worker %d, which no fault hit after it started", id, a.n, a.pid))
			}
		}
	}
	return out
}

// staleStart describes attempt a, which its worker started after it woke
// from pause p, past its lease: when, and what other attempts of the task
// had started by then.
func staleStart(a *attempt, as []*attempt, p fault) string {
	s := fmt.Sprintf("%s attempt %d started by worker %d %s after SIGCONT (paused %s, past its TTL)",
		a.id, a.n, a.pid, time.Duration(a.start-p.until.UnixNano()).Round(100*time.Microsecond), p.until.Sub(p.at).Round(time.Millisecond))
	for _, b := range as {
		if b != a && b.start < a.start {
			s += fmt.Sprintf("; attempt %d had started on worker %d %s before", b.n, b.pid, time.Duration(a.start-b.start).Round(time.Millisecond))
		}
	}
	return s
}

// takeover is how long a kind of fault kept tasks from running: for each
// task a hit worker had started and not finished, from the fault to the
// start of the task's next attempt; firsts is the earliest per fault.
type takeover struct {
	tasks  []time.Duration
	firsts []time.Duration
	slow   []string // the tasks that took longer than the goal, and why
}

// takeovers measures, per kind of fault, the delay from each fault to the
// next attempt of every task whose attempt it ended (see causeOf), and
// notes the tasks that took longer than goal.
func takeovers(f queueFacts, goal time.Duration) map[faultKind]*takeover {
	hits, _ := f.hits()
	out := map[faultKind]*takeover{}
	firsts := map[time.Time]time.Duration{} // per fault, by its time
	kinds := map[time.Time]faultKind{}
	for _, as := range f.attempts {
		for _, a := range as {
			ft, ok := causeOf(hits, a)
			if !ok || f.accepted(a) {
				continue
			}
			next := int64(0)
			for _, b := range as {
				if b.n > a.n && (next == 0 || b.start < next) {
					next = b.start
				}
			}
			if next == 0 {
				continue
			}
			d := time.Duration(next - ft.at.UnixNano())
			tk := out[ft.kind]
			if tk == nil {
				tk = &takeover{}
				out[ft.kind] = tk
			}
			tk.tasks = append(tk.tasks, d)
			if d > goal {
				tk.slow = append(tk.slow, fmt.Sprintf("%s attempt %d of worker %d, hit at %s: next attempt %s later",
					a.id, a.n, a.pid, ft.at.Format("15:04:05.000"), round(d)))
			}
			if fd, ok := firsts[ft.at]; !ok || d < fd {
				firsts[ft.at], kinds[ft.at] = d, ft.kind
			}
		}
	}
	for at, d := range firsts {
		out[kinds[at]].firsts = append(out[kinds[at]].firsts, d)
	}
	for _, tk := range out {
		slices.Sort(tk.tasks)
		slices.Sort(tk.firsts)
	}
	return out
}

// quantile returns the q-quantile (0..1) of sorted durations, 0 if none.
func quantile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, int(float64(len(d))*q))]
}
