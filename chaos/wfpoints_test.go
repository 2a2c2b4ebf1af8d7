package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
)

// wfPoint is a point of a workflow at which the parents' worker is hit.
type wfPoint struct {
	name string
	// prepare runs before the victim starts: it may start the children's
	// worker. before waits until the point is reached; hit is called just
	// before the fault lands (it may release the last children); after
	// runs once it landed (it starts what the point held back).
	kidsLate bool // the children's worker starts only after the fault
	gate     bool // the last child of each parent is held until the point
	before   func(r *wfRun)
	hit      func(r *wfRun)
	// landed checks, once the fault landed at at on process victim, that
	// it hit the point: it returns what it saw, and false if it missed.
	landed func(r *wfRun, victim int, at time.Time) (string, bool)
}

// wfPoints are the points of issue 38's item 5: right after spawning,
// while waiting (for children, for a signal), as the last child
// completes, as the signal arrives.
var wfPoints = []wfPoint{
	{name: "spawned", before: func(r *wfRun) {
		// The victim's spawning step has done its work: the checkpoint
		// of its spawn and the children's submission are under way.
		waitFor(r.t, "a spawn step to end", 60*time.Second, func() bool { return countMarks(r.log, "E", "/plan") > 0 })
	}, landed: func(r *wfRun, _ int, _ time.Time) (string, bool) {
		// Either is a point worth hitting: the spawn checkpointed or not.
		return fmt.Sprintf("%d of %d parents had their plan checkpoint stored at the fault", r.planRecords(), len(r.parents)), true
	}},
	{name: "waiting-children", kidsLate: true, before: func(r *wfRun) {
		waitFor(r.t, "every parent to wait for its children", 60*time.Second, func() bool {
			_, kids := r.statuses()
			return kids == len(r.parents)
		})
	}},
	{name: "last-child", gate: true, before: func(r *wfRun) {
		// Every child but the last of each parent ended; the last runs,
		// held by the gate, and the parents wait for it.
		waitFor(r.t, "all children but the last to end", 60*time.Second, func() bool {
			_, kids := r.statuses()
			return kids == len(r.parents) && countMarks(r.log, "E", ".") == len(r.parents)*(r.children-1)
		})
	}, hit: func(r *wfRun) { _ = os.Remove(filepath.Join(r.dir, "gate")) }},
	{name: "waiting-signal", before: func(r *wfRun) {
		waitFor(r.t, "every parent to wait for its signal", 60*time.Second, func() bool {
			st, kids := r.statuses()
			return kids == 0 && st[queue.Waiting] == len(r.parents)
		})
	}},
	{name: "signal-arrives", before: func(r *wfRun) {
		waitFor(r.t, "every parent to wait for its signal", 60*time.Second, func() bool {
			st, kids := r.statuses()
			return kids == 0 && st[queue.Waiting] == len(r.parents)
		})
		for _, id := range r.parents {
			r.signal(id)
		}
		// The victim resumed a parent: its act step runs.
		waitFor(r.t, "a resumed step", 60*time.Second, func() bool { return countMarks(r.log, "S", "/act") > 0 })
	}, landed: func(r *wfRun, victim int, at time.Time) (string, bool) {
		runs, _, _ := readAttempts(r.log)
		n := 0
		for id, as := range runs {
			for _, a := range as {
				if strings.HasSuffix(id, "/act") && a.pid == victim && a.start < at.UnixNano() && (a.end == 0 || a.end > at.UnixNano()) {
					n++
				}
			}
		}
		return fmt.Sprintf("%d act steps in flight in the victim at the fault", n), n > 0
	}},
}

func sigName(sig syscall.Signal) string {
	if sig == syscall.SIGKILL {
		return "SIGKILL"
	}
	return "SIGSTOP"
}

// countMarks counts the runs log's lines of kind whose id contains part.
func countMarks(log, kind, part string) int {
	b, _ := os.ReadFile(log)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) == 5 && f[0] == kind && strings.Contains(f[1], part) {
			n++
		}
	}
	return n
}

// TestWorkflowCrashPoints hits the parents' worker process, at each point
// of a workflow, with SIGKILL (and, with DROVER_CHAOS=long, with SIGSTOP
// past its TTL, then SIGCONT):
// right after spawning, while the parents wait for their children, as the
// last child completes, while they wait for a signal, and as the signal
// arrives. Three parents spawn ten children each (run by another process)
// and wait for a signal; a rescuer process works the parents' queue after
// the fault. It counts across the processes: each child ran once (the
// victim runs none), each signal was consumed once, each parent's steps
// each checkpointed once and run again only when their run was in flight
// in the victim when the fault hit it, and the victim started nothing
// after it.
//
//	go test -race -run TestWorkflowCrashPoints -v ./chaos/
//	DROVER_CHAOS=long go test -race -run TestWorkflowCrashPoints -v ./chaos/
func TestWorkflowCrashPoints(t *testing.T) {
	set := startEtcdSet(t, droverBin(t), 1)
	sigs := []syscall.Signal{syscall.SIGKILL}
	if long() {
		sigs = append(sigs, syscall.SIGSTOP)
	}
	for _, p := range wfPoints {
		for _, sig := range sigs {
			t.Run(p.name+"/"+sigName(sig), func(t *testing.T) {
				_ = runWFPoint(t, set, p, sig)
			})
		}
	}
}

// wfSeq numbers the runs' namespaces.
var wfSeq atomic.Int64

// runWFPoint plays one point with one signal.
// It returns the longest time a child stayed PENDING before a worker
// claimed it.
func runWFPoint(t *testing.T, set *etcdSet, p wfPoint, sig syscall.Signal) time.Duration {
	const ttl = 2 * time.Second
	ns := fmt.Sprintf("wfp-%s-%s-%d", p.name, sigName(sig), wfSeq.Add(1))
	began := time.Now()
	r := newWFRun(t, set, ns, 3, 10, "-ttl", ttl.String(), "-step-time", "300ms", "-child-time", "20ms")
	gate := filepath.Join(r.dir, "gate")
	if p.gate {
		if err := os.WriteFile(gate, nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.submit(context.Background(), r.parents...); err != nil {
		t.Fatal(err)
	}
	if !p.kidsLate {
		r.start("kids", "-gate", gate)
	}
	victim := r.start("parents")
	p.before(r)
	if p.hit != nil {
		p.hit(r)
	}
	if err := victim.signal(sig); err != nil {
		t.Fatal(err)
	}
	at := time.Now()
	kind := faultWorkerKill
	if sig == syscall.SIGSTOP {
		kind = faultWorkerPause
		if !victim.waitStopped() {
			t.Fatalf("the victim was not seen stopped")
		}
		at = time.Now()
	} else if !victim.endedBy(syscall.SIGKILL) {
		t.Fatalf("the victim was not ended by SIGKILL: %v", victim.err)
	}
	r.faults = append(r.faults, fault{kind: kind, at: at, pids: []int{victim.pid}})
	if p.landed != nil {
		saw, ok := p.landed(r, victim.pid, at)
		t.Logf("%s/%s: %s", p.name, sigName(sig), saw)
		if !ok {
			t.Errorf("the fault missed the point %s: %s", p.name, saw)
		}
	}
	if p.kidsLate {
		r.start("kids", "-gate", gate)
	}
	r.start("parents")
	if sig == syscall.SIGSTOP {
		time.Sleep(ttl + 1500*time.Millisecond)
		_ = victim.signal(syscall.SIGCONT)
	}
	r.waitAll(90 * time.Second)
	r.stopAll()
	c := r.check()
	t.Logf("%s/%s: took %s; child runs %d (%d children run again, %d runs excused), step runs %d (%d steps run again, %d excused), victim exit %d, double runs %d",
		p.name, sigName(sig), time.Since(began).Round(time.Millisecond), c.childRuns, c.childrenAgain, c.childExcused, c.stepRuns, c.stepsAgain, c.stepExcused, victim.exitCode(), c.doubleRuns)
	if c.childrenAgain != 0 {
		t.Errorf("%d children ran more than once; the victim runs none", c.childrenAgain)
	}
	for _, s := range first(c.problems) {
		t.Error(s)
	}
	slow, slowest := r.pickup()
	t.Logf("longest wait of a child from PENDING to its claim: %s (%s)", slow.Round(time.Millisecond), slowest)
	return slow
}

// TestWorkflowChildrenClaimedPromptly reproduces a bug the crash points
// found: the children a parent spawned sometimes stay PENDING about 30 s
// in queue kids while its worker, a separate process, is idle: their
// transitions show PENDING at the spawn and RUNNING 30 s later, when the
// other parents' children ran at once. It came most often after the
// parents' worker was paused right after its spawning step and another
// worker took the three parents over at once (spawned/SIGSTOP), and on a
// loaded machine also before any fault, at a plain spawn. Plain
// submissions of three batches at once to an idle worker are claimed in
// about 100 ms. It plays spawned/SIGSTOP up to five times and fails when
// a child waited more than 10 s.
func TestWorkflowChildrenClaimedPromptly(t *testing.T) {
	set := startEtcdSet(t, droverBin(t), 1)
	for i := range 5 {
		var slow time.Duration
		t.Run(fmt.Sprint(i), func(t *testing.T) { slow = runWFPoint(t, set, wfPoints[0], syscall.SIGSTOP) })
		if slow > 10*time.Second {
			t.Fatalf("run %d: a child of a parent taken over after its spawn waited %s PENDING before a worker claimed it, its worker idle", i, slow.Round(time.Millisecond))
		}
	}
}
