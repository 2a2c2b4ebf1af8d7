package chaos

import (
	"context"
	"math/rand/v2"
	"syscall"
	"testing"
	"time"
)

// wfChaosConfig sizes a chaos run of workflows.
type wfChaosConfig struct {
	parents, children int
	spacing           time.Duration // between two parents' submissions
	workers           int
	ttl               time.Duration
	killEvery         time.Duration // one worker SIGKILL this often, from 1.5 s
	pauseAt, serverAt time.Duration
	deadline          time.Duration
}

func wfChaosConfigFor(long bool) wfChaosConfig {
	c := wfChaosConfig{parents: 12, children: 20, spacing: 800 * time.Millisecond, workers: 3, ttl: 2 * time.Second,
		killEvery: 2 * time.Second, pauseAt: 3 * time.Second, serverAt: 6 * time.Second, deadline: 90 * time.Second}
	if long {
		c.parents, c.children, c.spacing = 60, 50, 500*time.Millisecond
		c.serverAt, c.deadline = 15*time.Second, 10*time.Minute
	}
	return c
}

// TestWorkflowChaos runs workflows (a parent spawns children, waits for
// all, then waits for a signal) on three worker processes, each working
// the parents' and the children's queues, while a worker is SIGKILLed
// every 2 s (and replaced), one is SIGSTOPped past its TTL, and the server
// is SIGKILLed and restarted on its data dir. Parents are submitted one
// every 0.8 s so that every fault finds workflows at every stage; a third
// of them get their signal before they wait for it, the others once they
// wait; each signal is sent twice with one key. It counts across the
// processes: each parent SUCCEEDED with its children's count and its
// signal, three step records, its signal consumed once; each child stored
// once and SUCCEEDED; each child and step ran once, except a run in flight
// in a process a fault hit (counted, and reported); no process started a
// run after a fault hit it.
//
//	go test -race -run TestWorkflowChaos -v ./chaos/
//	DROVER_CHAOS=long go test -race -run TestWorkflowChaos -v -timeout 20m ./chaos/
func TestWorkflowChaos(t *testing.T) {
	cfg := wfChaosConfigFor(long())
	set := startEtcdSet(t, droverBin(t), 1)
	r := newWFRun(t, set, "wfchaos", cfg.parents, cfg.children, "-ttl", cfg.ttl.String(), "-step-time", "100ms", "-child-time", "100ms", "-concurrency", "8")
	slots := make([]*workerProc, cfg.workers)
	for i := range slots {
		slots[i] = r.start("both")
	}
	d := &wfDriver{r: r, cfg: cfg, set: set, slots: slots, rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 2)), noted: map[int]bool{}}
	began := time.Now()
	d.drive(began)
	d.noteExits(false)
	kills, paused, pausedAt, serverDone := d.kills, d.paused, d.pausedAt, d.serverDone
	took := time.Since(began)
	if paused != nil {
		_ = paused.signal(syscall.SIGCONT)
		r.faults = append(r.faults, fault{kind: faultWorkerPause, at: pausedAt, until: time.Now(), pids: []int{paused.pid}})
	}
	r.stopAll()
	c := r.check()
	slow, slowest := r.pickup()
	t.Logf("workflow chaos: %d parents x %d children on %d workers, TTL %s; took %s; %d worker SIGKILLs, 1 SIGSTOP past TTL, server killed %t",
		cfg.parents, cfg.children, cfg.workers, cfg.ttl, took.Round(time.Millisecond), kills, serverDone)
	t.Logf("children: %d runs for %d children, %d run again (%d runs excused: in flight at a fault); steps: %d runs for %d, %d run again (%d excused); stale starts %d",
		c.childRuns, cfg.parents*cfg.children, c.childrenAgain, c.childExcused, c.stepRuns, cfg.parents*3, c.stepsAgain, c.stepExcused, c.staleStarts)
	t.Logf("longest wait of a child from PENDING to its claim: %s (%s)", slow.Round(time.Millisecond), slowest)
	writeFigures(t, "workflow", map[string]any{"parents": cfg.parents, "children": cfg.children, "took_ms": took.Milliseconds(),
		"worker_kills": kills, "server_killed": serverDone, "child_runs": c.childRuns, "children_run_more_than_once": c.childrenAgain,
		"child_runs_excused": c.childExcused, "step_runs": c.stepRuns, "steps_run_more_than_once": c.stepsAgain, "double_runs": c.doubleRuns, "step_runs_excused": c.stepExcused,
		"problems": len(c.problems), "longest_pending_ms": slow.Milliseconds()})
	if !serverDone || pausedAt.IsZero() || kills == 0 {
		t.Errorf("the workflows finished before every planned fault (server killed %t, paused %t, %d kills): make the run longer", serverDone, !pausedAt.IsZero(), kills)
	}
	for _, s := range first(c.problems) {
		t.Error(s)
	}
}

// wfDriver submits, signals and injects the faults of TestWorkflowChaos.
type wfDriver struct {
	r          *wfRun
	cfg        wfChaosConfig
	set        *etcdSet
	slots      []*workerProc
	rng        *rand.Rand
	submitted  int
	kills      int
	paused     *workerProc
	pausedAt   time.Time
	pausedPID  int
	serverDone bool
	// serverKilled and serverReady bound the outage.
	serverKilled, serverReady time.Time
	noted                     map[int]bool // workers whose exit noteExits recorded
}

// drive runs until every parent finished, or fails the test at the
// deadline.
func (d *wfDriver) drive(began time.Time) {
	r, cfg := d.r, d.cfg
	nextKill := began.Add(1500 * time.Millisecond)
	for {
		time.Sleep(100 * time.Millisecond)
		el := time.Since(began)
		if el > cfg.deadline {
			st, _ := r.statuses()
			r.t.Fatalf("the workflows did not finish within %s: %v", cfg.deadline, st)
		}
		d.submitDue(el)
		if d.paused != nil && time.Since(d.pausedAt) > cfg.ttl+1500*time.Millisecond {
			_ = d.paused.signal(syscall.SIGCONT)
			r.faults = append(r.faults, fault{kind: faultWorkerPause, at: d.pausedAt, until: time.Now(), pids: []int{d.paused.pid}})
			d.paused = nil
		}
		d.noteExits(true)
		if r.signalWaiting() == cfg.parents && d.submitted == cfg.parents {
			return
		}
		switch {
		case !d.serverDone && el >= cfg.serverAt:
			d.killServer()
		case d.paused == nil && d.pausedAt.IsZero() && el >= cfg.pauseAt:
			w := d.slots[d.rng.IntN(len(d.slots))]
			if w.signal(syscall.SIGSTOP) == nil {
				if !w.waitStopped() {
					r.t.Fatalf("worker %d was not seen stopped after SIGSTOP", w.pid)
				}
				d.paused, d.pausedAt, d.pausedPID = w, time.Now(), w.pid
			}
		case time.Now().After(nextKill):
			nextKill = nextKill.Add(cfg.killEvery)
			d.killWorker()
		}
	}
}

// noteExits records a fault for each worker in a slot that exited by
// itself, and starts another in its slot when restart. Only a lost lease
// (exit code 70) after the worker's pause or in the outage (until TTL +
// 2 s after the server was back) is a fault's consequence; any other exit
// is a test error.
func (d *wfDriver) noteExits(restart bool) {
	r := d.r
	for i, w := range d.slots {
		if !w.exited() || w == d.paused || d.noted[w.pid] {
			continue
		}
		d.noted[w.pid] = true
		kind, code := faultSelfExit, w.exitCode()
		switch {
		case code != 70:
		case w.pid == d.pausedPID && !d.pausedAt.IsZero():
			kind = faultWorkerPause // the paused worker, ending after its pause
		case d.serverDone && w.ended.After(d.serverKilled) && w.ended.Before(d.serverReady.Add(d.cfg.ttl+2*time.Second)):
			kind = faultOutageExit
		}
		r.faults = append(r.faults, fault{kind: kind, at: w.ended, pids: []int{w.pid}})
		if kind == faultSelfExit {
			r.t.Errorf("worker %d exited by itself with code %d at %s, not a lost lease (70) after its pause or in the outage", w.pid, code, stamp(w.ended.UnixNano()))
		} else {
			r.t.Logf("worker %d exited by itself (code %d) at %s: %s", w.pid, code, stamp(w.ended.UnixNano()), kind)
		}
		if restart {
			d.slots[i] = r.start("both")
		}
	}
}

// submitDue submits the parents due by el; a third of them get their
// signal at once, before they wait for it.
func (d *wfDriver) submitDue(el time.Duration) {
	for d.submitted < d.cfg.parents && el >= time.Duration(d.submitted)*d.cfg.spacing {
		id := d.r.parents[d.submitted]
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		err := d.r.submit(ctx, id)
		cancel()
		if err != nil {
			return // the server is down: next tick
		}
		if d.submitted%3 == 0 {
			d.r.signal(id) // kept in its inbox
		}
		d.submitted++
	}
}

// killServer kills the server and restarts it on its data dir after TTL +
// 0.5 s. The fault names no worker: it hits only the runs in flight at
// the kill (see causeOf); a worker that lost its lease in the outage is a
// fault of its own (noteExits).
func (d *wfDriver) killServer() {
	o := d.set.killAndRestart(d.set.members[0], d.cfg.ttl+500*time.Millisecond)
	d.r.faults = append(d.r.faults, fault{kind: faultServerKill, at: o.killed, until: o.ready})
	d.serverDone, d.serverKilled, d.serverReady = true, o.killed, o.ready
}

// killWorker SIGKILLs a random worker that is not paused and starts
// another in its slot.
func (d *wfDriver) killWorker() {
	i := d.rng.IntN(len(d.slots))
	if w := d.slots[i]; w != d.paused && w.signal(syscall.SIGKILL) == nil {
		if !w.endedBy(syscall.SIGKILL) {
			d.r.t.Errorf("worker %d was not ended by the SIGKILL sent: %v", w.pid, w.err)
		}
		d.r.faults = append(d.r.faults, fault{kind: faultWorkerKill, at: time.Now(), pids: []int{w.pid}})
		d.slots[i] = d.r.start("both")
		d.kills++
	}
}
