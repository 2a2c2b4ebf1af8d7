package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// chaosQueue is the queue the chaos run works.
const chaosQueue = "chaos"

// queueConfig sizes a chaos run of the queue.
type queueConfig struct {
	tasks       int
	workers     int
	concurrency int
	prefetch    int           // the workers' -prefetch; 0: their default
	ttl         time.Duration // the workers' lease TTL (-ttl)
	taskTime    time.Duration // how long each attempt works (-task-time)
	firstKill   time.Duration // first worker SIGKILL, after the start
	killEvery   time.Duration // then one worker SIGKILL this often
	pauseAt     []time.Duration
	serverAt    time.Duration // when the server (the leader) is killed
	deadline    time.Duration // the whole run, at most
	// leaderOnly: the plan's one fault is the server's (the leader's)
	// kill; no worker is killed or paused.
	leaderOnly bool
}

// queueConfigFor returns the CI or the long configuration.
func queueConfigFor(long bool) queueConfig {
	c := queueConfig{tasks: 2000, workers: 3, concurrency: 4, ttl: 2 * time.Second, taskTime: 50 * time.Millisecond,
		firstKill: 1500 * time.Millisecond, killEvery: 2 * time.Second, pauseAt: []time.Duration{2500 * time.Millisecond},
		serverAt: 8 * time.Second, deadline: 4 * time.Minute}
	if long {
		c.tasks, c.concurrency, c.taskTime = 10000, 8, 100*time.Millisecond
		c.pauseAt = []time.Duration{3 * time.Second, 35 * time.Second}
		c.serverAt, c.deadline = 18*time.Second, 15*time.Minute
	}
	return c
}

// TestQueueChaos runs the queue under worker SIGKILLs every 2 s, a worker
// SIGSTOPped past its TTL, and the server SIGKILLed and restarted on its
// data dir (kept down TTL + 0.5 s); then checks every task's fate (see
// queueRun.check and analyze).
//
//	go test -race -run TestQueueChaos -v ./chaos/
//	DROVER_CHAOS=long go test -race -run TestQueueChaos -v -timeout 30m ./chaos/
func TestQueueChaos(t *testing.T) {
	runQueueChaos(t, startEtcdSet(t, droverBin(t), 1))
}

// queueRun is one chaos run of the queue: its servers, its workers, and
// every fault injected.
type queueRun struct {
	t         *testing.T
	cfg       queueConfig
	bin       string // drover
	workerBin string // chaos/internal/chaosworker
	dir       string
	log       string // the attempts log every worker appends to
	set       *etcdSet
	cli       *clientv3.Client
	client    *queue.Client
	rng       *rand.Rand
	seq       int
	workers   []*workerProc // the live worker of each slot
	all       []*workerProc // every worker process started
	faults    []fault
	outages   []outage
	paused    *workerProc // the worker stopped now, if any
	resumeAt  time.Time
}

// workerProc is one chaos worker process and what happened to it.
type workerProc struct {
	*process
	slot    int
	out     string    // its stdout: its counts as JSON when it stops
	killed  time.Time // SIGKILL by the test
	paused  time.Time // SIGSTOP by the test
	resumed time.Time // SIGCONT by the test
}

// faultKind names a kind of fault.
type faultKind string

const (
	faultWorkerKill  faultKind = "worker SIGKILL"
	faultWorkerPause faultKind = "worker SIGSTOP past TTL"
	faultServerKill  faultKind = "server SIGKILL + restart"
	faultLeaderKill  faultKind = "leader SIGKILL + restart"
	faultClientKill  faultKind = "client SIGKILL"
	faultClientPause faultKind = "client SIGSTOP past TTL"
	faultOutageExit  faultKind = "worker lost its lease in the outage"
	faultSelfExit    faultKind = "worker lost its lease (no fault injected)"
)

// fault is one fault injected (or a worker's exit that followed one): its
// kind, when, until when (a pause, an outage), and the processes it hit.
type fault struct {
	kind  faultKind
	at    time.Time
	until time.Time
	pids  []int
}

// newQueueRun prepares a run of cfg on the servers of set.
func newQueueRun(t *testing.T, set *etcdSet, cfg queueConfig) *queueRun {
	r := &queueRun{t: t, cfg: cfg, bin: set.bin, set: set, workerBin: workerBin(t), dir: t.TempDir(), rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1))}
	r.log = filepath.Join(r.dir, "attempts.log")
	r.cli = etcdClient(t, r.set.endpoints())
	var err error
	if r.client, err = queue.NewClient(r.cli, "drover"); err != nil {
		t.Fatal(err)
	}
	return r
}

// runQueueChaos runs the chaos scenario on the servers of set.
func runQueueChaos(t *testing.T, set *etcdSet) {
	cfg := queueConfigFor(long())
	r := newQueueRun(t, set, cfg)
	r.submit()
	began := time.Now()
	for i := range cfg.workers {
		r.workers = append(r.workers, r.startWorker(i))
	}
	r.drive(began)
	took := time.Since(began)
	r.stopWorkers()
	rep := r.check()
	rep.members, rep.took = len(set.members), took
	rep.print(t)
	writeFigures(t, "queue", rep.figures())
}

// drover runs a drover client command against the set and returns its
// standard output.
func (r *queueRun) drover(args ...string) []byte {
	r.t.Helper()
	full := append([]string{"--etcd-endpoints", strings.Join(r.set.endpoints(), ","), "--log-level", "warn"}, args...)
	cmd := exec.Command(r.bin, full...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		r.t.Fatalf("drover %s: %v\n%s", strings.Join(args, " "), err, errb.String())
	}
	return out.Bytes()
}

// submit submits the run's tasks with drover submit, each with a budget of
// retries no fault plan here can use up.
func (r *queueRun) submit() {
	var b bytes.Buffer
	for i := range r.cfg.tasks {
		fmt.Fprintf(&b, `{"task_id":"t-%05d","task_type":"chaos","max_retries":20}`+"\n", i)
	}
	file := filepath.Join(r.dir, "tasks.jsonl")
	if err := os.WriteFile(file, b.Bytes(), 0o644); err != nil {
		r.t.Fatal(err)
	}
	var res struct {
		Submitted int `json:"submitted"`
	}
	if err := json.Unmarshal(r.drover("submit", "--queue", chaosQueue, "--file", file, "--json"), &res); err != nil || res.Submitted != r.cfg.tasks {
		r.t.Fatalf("submitted %d of %d tasks (%v)", res.Submitted, r.cfg.tasks, err)
	}
}

// startWorker starts a worker process (chaos/internal/chaosworker) in
// slot: a queue.Worker whose handler logs each attempt to the attempts log
// and returns "task attempt pid" as the result.
func (r *queueRun) startWorker(slot int) *workerProc {
	r.seq++
	base := filepath.Join(r.dir, fmt.Sprintf("worker-%03d", r.seq))
	out, err := os.Create(base + ".out")
	if err != nil {
		r.t.Fatal(err)
	}
	errf, err := os.Create(base + ".err")
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = out.Close(); _ = errf.Close() })
	p := startProcess(r.t, "worker", out, errf, nil, r.workerBin,
		"-endpoints", strings.Join(r.set.endpoints(), ","), "-queue", chaosQueue, "-log", r.log,
		"-concurrency", fmt.Sprint(r.cfg.concurrency), "-prefetch", fmt.Sprint(r.cfg.prefetch),
		"-ttl", r.cfg.ttl.String(), "-task-time", r.cfg.taskTime.String())
	w := &workerProc{process: p, slot: slot, out: base + ".out"}
	r.all = append(r.all, w)
	return w
}

// drive injects the faults while the queue works, until every task has
// finished or the deadline passes.
func (r *queueRun) drive(began time.Time) {
	cfg := r.cfg
	nextKill, pauses, serverDone := began.Add(cfg.firstKill), 0, false
	for time.Since(began) < cfg.deadline {
		time.Sleep(100 * time.Millisecond)
		r.resumeDue()
		r.replaceExited()
		if r.drained() {
			break
		}
		switch el := time.Since(began); {
		case !serverDone && el >= cfg.serverAt:
			r.killServer()
			serverDone = true
		case pauses < len(cfg.pauseAt) && el >= cfg.pauseAt[pauses] && r.paused == nil && r.pauseWorker():
			pauses++
		case time.Now().After(nextKill):
			if r.killAllowed(began) {
				r.killWorker()
			}
			nextKill = nextKill.Add(cfg.killEvery)
		}
	}
	if !r.drained() {
		st, _ := r.client.Stats(context.Background(), chaosQueue)
		r.t.Fatalf("the queue did not finish within %s: %+v", cfg.deadline, st)
	}
	if !serverDone || pauses < len(cfg.pauseAt) {
		r.t.Errorf("the queue finished before every planned fault (server killed %t, %d of %d pauses): make the run longer", serverDone, pauses, len(cfg.pauseAt))
	}
}

// drained reports whether every task has finished.
func (r *queueRun) drained() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := r.client.Stats(ctx, chaosQueue)
	return err == nil && st.Pending+st.Running+st.Retrying == 0 && st.Total() == int64(r.cfg.tasks)
}

// killAllowed keeps worker kills away from the server's outage (by TTL +
// 1 s either side), so that each takeover measured is a worker's alone.
func (r *queueRun) killAllowed(began time.Time) bool {
	quiet := r.cfg.ttl + time.Second
	at := began.Add(r.cfg.serverAt)
	if time.Now().After(at.Add(-quiet)) && (len(r.outages) == 0 || time.Now().Before(r.outages[0].ready.Add(quiet))) {
		return false
	}
	return true
}

// live returns the slots whose worker runs and is not paused.
func (r *queueRun) live() []int {
	var slots []int
	for i, w := range r.workers {
		if !w.exited() && w != r.paused {
			slots = append(slots, i)
		}
	}
	return slots
}

// killWorker SIGKILLs a random live worker and starts another in its slot.
func (r *queueRun) killWorker() {
	slots := r.live()
	if len(slots) == 0 {
		return
	}
	w := r.workers[slots[r.rng.IntN(len(slots))]]
	if w.signal(syscall.SIGKILL) != nil {
		return
	}
	w.killed = time.Now()
	<-w.done
	r.faults = append(r.faults, fault{kind: faultWorkerKill, at: w.killed, pids: []int{w.pid}})
	r.workers[w.slot] = r.startWorker(w.slot)
}

// pauseWorker SIGSTOPs, for TTL + 1.5 s, the live worker with the most
// attempts started and not finished (the attempts log says), so that the
// pause catches work in flight; with none busy it waits for the next tick.
func (r *queueRun) pauseWorker() bool {
	busy := r.inFlight()
	var w *workerProc
	for _, s := range r.live() {
		if c := r.workers[s]; busy[c.pid] > 0 && (w == nil || busy[c.pid] > busy[w.pid]) {
			w = c
		}
	}
	if w == nil || w.signal(syscall.SIGSTOP) != nil {
		return false
	}
	// The pause starts when the kernel has stopped the worker: what it
	// wrote before then, under a lease still valid, is not late.
	if !w.waitStopped() {
		r.t.Logf("worker %d: not seen stopped within 5 s of its SIGSTOP; its pause counts from now", w.pid)
	}
	w.paused = time.Now()
	r.paused, r.resumeAt = w, w.paused.Add(r.cfg.ttl+1500*time.Millisecond)
	return true
}

// inFlight counts, per worker pid, the attempts the log shows started and
// not finished.
func (r *queueRun) inFlight() map[int]int {
	out := map[int]int{}
	attempts, _, err := readAttempts(r.log)
	if err != nil {
		return out
	}
	for _, as := range attempts {
		for _, a := range as {
			if a.end == 0 {
				out[a.pid]++
			}
		}
	}
	return out
}

// resumeDue sends SIGCONT to the paused worker once its pause is over.
func (r *queueRun) resumeDue() {
	w := r.paused
	if w == nil || time.Now().Before(r.resumeAt) {
		return
	}
	_ = w.signal(syscall.SIGCONT)
	w.resumed = time.Now()
	r.paused = nil
	r.faults = append(r.faults, fault{kind: faultWorkerPause, at: w.paused, until: w.resumed, pids: []int{w.pid}})
}

// replaceExited starts a worker in each slot whose worker ended by itself
// (a lost lease after a pause or an outage, etcd unreachable at start).
func (r *queueRun) replaceExited() {
	for i, w := range r.workers {
		if w.exited() {
			r.workers[i] = r.startWorker(i)
		}
	}
}

// killServer kills the server (the leader) with SIGKILL and restarts it
// after TTL + 0.5 s, so that the workers' leases run out while it is down
// (a quicker restart costs no work at all); the workers alive then are the
// ones it hit.
func (r *queueRun) killServer() {
	var pids []int
	for _, w := range r.workers {
		if !w.exited() {
			pids = append(pids, w.pid)
		}
	}
	kind, m := faultServerKill, r.set.members[0]
	if len(r.set.members) > 1 {
		kind = faultLeaderKill
		l, err := r.set.leader()
		if err != nil {
			r.t.Fatal(err)
		}
		m = l
	}
	o := r.set.killAndRestart(m, r.cfg.ttl+500*time.Millisecond)
	r.outages = append(r.outages, o)
	r.faults = append(r.faults, fault{kind: kind, at: o.killed, until: o.ready, pids: pids})
}

// stopWorkers ends every worker with SIGTERM (the queue is drained) and
// waits for them.
func (r *queueRun) stopWorkers() {
	if r.paused != nil {
		r.resumeAt = time.Time{}
		r.resumeDue()
	}
	for _, w := range r.workers {
		_ = w.signal(syscall.SIGTERM)
	}
	for _, w := range r.workers {
		if !w.wait(15 * time.Second) {
			r.t.Errorf("worker %d did not stop within 15 s of SIGTERM", w.pid)
			w.kill()
		}
	}
}
