package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// wfBin returns the workflow worker binary (chaos/internal/wfworker).
func wfBin(t *testing.T) string {
	t.Helper()
	build(t)
	return filepath.Join(buildDir, "wfworker")
}

// wfRun is a set of workflows run by wfworker processes in one namespace:
// parents in queue wf, each spawning children children into queue kids
// and waiting for the signal approval with the key sig-{parent}.
type wfRun struct {
	t        *testing.T
	set      *etcdSet
	ns       string
	dir      string
	log      string // the runs log every wfworker appends to
	cli      *clientv3.Client
	client   *queue.Client
	parents  []string
	children int
	args     []string // flags every wfworker gets
	procs    []*workerProc
	faults   []fault
	signaled map[string]bool
}

// newWFRun prepares a run in namespace ns with parents and children.
func newWFRun(t *testing.T, set *etcdSet, ns string, parents, children int, args ...string) *wfRun {
	t.Helper()
	r := &wfRun{t: t, set: set, ns: ns, dir: t.TempDir(), children: children, signaled: map[string]bool{}}
	r.log = filepath.Join(r.dir, "runs.log")
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		errs, _ := filepath.Glob(filepath.Join(r.dir, "*.err"))
		for _, f := range append(errs, r.log) {
			logTail(t, f)
		}
	})
	r.cli = etcdClient(t, set.endpoints())
	var err error
	if r.client, err = queue.NewClient(r.cli, ns); err != nil {
		t.Fatal(err)
	}
	for i := range parents {
		r.parents = append(r.parents, fmt.Sprintf("p-%03d", i))
	}
	r.args = append([]string{"-endpoints", strings.Join(set.endpoints(), ","), "-namespace", ns, "-log", r.log,
		"-children", fmt.Sprint(children)}, args...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.client.SetConfig(ctx, "kids", queue.Config{}); err != nil {
		t.Fatal(err)
	}
	return r
}

// submit submits parents ids, each with a budget of retries no fault here
// can use up.
func (r *wfRun) submit(ctx context.Context, ids ...string) error {
	var ts []queue.Task
	for _, id := range ids {
		ts = append(ts, queue.Task{ID: id, Type: "research", MaxRetries: new(20)})
	}
	_, err := r.client.Submit(ctx, "wf", ts, nil)
	return err
}

// start starts a wfworker of role with extra flags.
func (r *wfRun) start(role string, extra ...string) *workerProc {
	r.t.Helper()
	n := len(r.procs)
	errf, err := os.Create(filepath.Join(r.dir, fmt.Sprintf("wf-%03d-%s.err", n, role)))
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = errf.Close() })
	args := append(append([]string{"-role", role}, r.args...), extra...)
	w := &workerProc{process: startProcess(r.t, "wfworker-"+role, nil, errf, nil, wfBin(r.t), args...), slot: n}
	r.procs = append(r.procs, w)
	return w
}

// signalWaiting sends sig-{id} to every parent that waits for approval
// and was not sent it yet, twice (as a retry would), and reports how many
// parents are finished.
func (r *wfRun) signalWaiting() int {
	done := 0
	for _, id := range r.parents {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		tk, err := r.client.Get(ctx, id)
		cancel()
		if err != nil {
			continue
		}
		if tk.CurrentStatus.Terminal() {
			done++
			continue
		}
		if !r.signaled[id] && tk.CurrentStatus == queue.Waiting && tk.WaitingFor != nil && slices.Contains(tk.WaitingFor.Signals, "approval") {
			r.signal(id)
		}
	}
	return done
}

// signal sends parent id its signal twice with one key; it counts as sent
// once a send was answered.
func (r *wfRun) signal(id string) {
	for range 2 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := r.client.Signal(ctx, id, "approval", []byte(`{"approved":true}`), "sig-"+id)
		cancel()
		if err == nil {
			r.signaled[id] = true
		}
	}
}

// waitAll signals the parents as they wait until all are finished, for at
// most d.
func (r *wfRun) waitAll(d time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for r.signalWaiting() < len(r.parents) {
		if time.Now().After(deadline) {
			r.t.Fatalf("the workflows did not finish within %s", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitFor polls cond every 20 ms for at most d.
func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// statuses counts the parents by status, and those waiting for children.
func (r *wfRun) statuses() (map[queue.Status]int, int) {
	out, kids := map[queue.Status]int{}, 0
	for _, id := range r.parents {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		tk, err := r.client.Get(ctx, id)
		cancel()
		if err != nil {
			continue
		}
		out[tk.CurrentStatus]++
		if tk.CurrentStatus == queue.Waiting && tk.WaitingFor != nil && tk.WaitingFor.Children != nil {
			kids++
		}
	}
	return out, kids
}

// stopAll ends every wfworker with SIGCONT and SIGTERM and waits. A
// worker must exit 0 on SIGTERM (70, its lease lost, too if a pause hit
// it); one that had exited before must be one a fault named: any other
// end is a test error.
func (r *wfRun) stopAll() {
	hit, paused := map[int]bool{}, map[int]bool{}
	for _, ft := range r.faults {
		for _, pid := range ft.pids {
			hit[pid], paused[pid] = true, paused[pid] || ft.kind == faultWorkerPause
		}
	}
	before := map[*workerProc]bool{}
	for _, w := range r.procs {
		before[w] = w.exited()
		_ = w.signal(syscall.SIGCONT)
		_ = w.signal(syscall.SIGTERM)
	}
	for _, w := range r.procs {
		switch {
		case !w.wait(15 * time.Second):
			r.t.Errorf("wfworker %d did not stop within 15 s of SIGTERM", w.pid)
			w.kill()
		case before[w] && !hit[w.pid]:
			r.t.Errorf("wfworker %d exited by itself with code %d at %s, no fault named it", w.pid, w.exitCode(), stamp(w.ended.UnixNano()))
		case !before[w] && w.exitCode() != 0 && !(paused[w.pid] && w.exitCode() == 70):
			r.t.Errorf("wfworker %d exited with code %d on SIGTERM, want 0", w.pid, w.exitCode())
		}
	}
}

// wfCounts is what a run of workflows did, counted from the runs log and
// etcd.
type wfCounts struct {
	childRuns, childrenAgain, childExcused int // runs; children run more than once; runs again excused
	stepRuns, stepsAgain, stepExcused      int
	doubleRuns                             int // runs after the run whose outcome was stored
	staleStarts                            int // runs a process started after a fault hit it
	problems                               []string
}

// check counts the runs and checks every workflow: each parent SUCCEEDED
// with its children's count and its own signal; three step records; its
// signal consumed once and none left; the kids queue holds each child
// once, SUCCEEDED, with one success stored; each child and each step ran
// once, except a run whose outcome was never stored, ended by a fault
// before the next run, of a higher attempt, started (counted); no run
// after the one whose outcome was stored; no process started a run after
// a fault hit it.
func (r *wfRun) check() wfCounts {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var c wfCounts
	bad := func(format string, args ...any) { c.problems = append(c.problems, fmt.Sprintf(format, args...)) }
	store, err := task.NewStore(r.cli, r.ns)
	if err != nil {
		r.t.Fatal(err)
	}
	keys := keyspace.MustNew(r.ns)
	for _, id := range r.parents {
		tk, err := r.client.Get(ctx, id)
		want := fmt.Sprintf("merged=%d sig=sig-%s", r.children, id)
		if err != nil || tk.CurrentStatus != queue.Succeeded || string(tk.Result) != want {
			bad("%s: %v %v: want SUCCEEDED with %q", id, taskState(tk), err, want)
			continue
		}
		if hist, err := store.History(ctx, id); err != nil || len(hist) != 3 {
			bad("%s: %d step records (%v), want 3", id, len(hist), err)
		}
		in, err1 := r.cli.Get(ctx, keys.TaskSignals(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		// Consumed once: one seen tombstone, written once (version 1).
		seen, err2 := r.cli.Get(ctx, keys.TaskSignalsSeen(id), clientv3.WithPrefix())
		if err1 != nil || err2 != nil || in.Count != 0 || seen.Count != 1 || seen.Kvs[0].Version != 1 {
			bad("%s: signals left %v, consumed %v (%v %v) with versions %v: want 0, and 1 written once", id, countOf(in), countOf(seen), err1, err2, versions(seen))
		}
	}
	if st, err := r.client.Stats(ctx, "kids"); err != nil || st.Succeeded != int64(len(r.parents)*r.children) || st.Total() != st.Succeeded {
		bad("kids: %+v (%v): want %d SUCCEEDED and nothing else", st, err, len(r.parents)*r.children)
	}
	r.countRuns(ctx, &c)
	return c
}

func taskState(tk *queue.Task) string {
	if tk == nil {
		return "none"
	}
	return fmt.Sprintf("%s %q (%s)", tk.CurrentStatus, tk.Result, tk.LastError)
}

// versions lists the versions of the keys r read.
func versions(r *clientv3.GetResponse) []int64 {
	if r == nil {
		return nil
	}
	var out []int64
	for _, kv := range r.Kvs {
		out = append(out, kv.Version)
	}
	return out
}

func countOf(r *clientv3.GetResponse) int64 {
	if r == nil {
		return -1
	}
	return r.Count
}

// countRuns reads the runs log and what etcd stored: every child and
// every step ran at least once; the outcome stored (a child's success, a
// step's record) is that of its last run; each run before it was hit by
// a fault of its process (or, for a server kill, was in flight at it)
// after it started and before the next run started, and the next run has
// a higher attempt number; any run after the one stored is a double run.
func (r *wfRun) countRuns(ctx context.Context, c *wfCounts) {
	runs, unread, err := readAttempts(r.log)
	if err != nil || unread != 0 {
		c.problems = append(c.problems, fmt.Sprintf("runs log: %d lines unread (%v)", unread, err))
	}
	stored := r.storedRuns(ctx, runs, c)
	ids := make([]string, 0, len(runs))
	for id := range runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if _, ok := stored[id]; !ok {
			c.problems = append(c.problems, fmt.Sprintf("%s ran, but is no child or step of the run", id))
		}
	}
	for id, ci := range stored {
		as := runs[id]
		if len(as) == 0 {
			c.problems = append(c.problems, fmt.Sprintf("%s never ran", id))
			continue
		}
		excused := r.judgeRuns(id, as, ci, c)
		if strings.Contains(id, "/") {
			c.stepRuns += len(as)
			c.stepExcused += excused
			if len(as) > 1 {
				c.stepsAgain++
			}
		} else {
			c.childRuns += len(as)
			c.childExcused += excused
			if len(as) > 1 {
				c.childrenAgain++
			}
		}
	}
	r.staleStarts(runs, c)
}

// judgeRuns judges the runs as of id, whose outcome stored is that of
// as[ci] (-1: none matches), and returns how many runs were excused.
func (r *wfRun) judgeRuns(id string, as []*attempt, ci int, c *wfCounts) int {
	if ci < 0 {
		c.problems = append(c.problems, fmt.Sprintf("%s: the outcome stored is from no run logged", id))
		return 0
	}
	excused := 0
	for i, a := range as {
		switch {
		case i > ci:
			c.doubleRuns++
			c.problems = append(c.problems, fmt.Sprintf("%s ran twice: attempt %d by %d started %s, after the run whose outcome is stored (attempt %d by %d)",
				id, a.n, a.pid, stamp(a.start), as[ci].n, as[ci].pid))
		case i < ci:
			f, ok := r.causeOf(a)
			next := as[i+1]
			if !ok || f.at.UnixNano() > next.start || next.n <= a.n {
				c.problems = append(c.problems, fmt.Sprintf("%s ran again (attempt %d by %d started %s) with no fault ending the run before (attempt %d by %d started %s, work done %t; %s)",
					id, next.n, next.pid, stamp(next.start), a.n, a.pid, stamp(a.start), a.end != 0, r.procState(a.pid)))
				continue
			}
			excused++
		}
	}
	return excused
}

func stamp(ns int64) string { return time.Unix(0, ns).Format("15:04:05.000") }

// causeOf is the first fault after run a started that hit its process,
// or, for a server kill that names no process, that a was in flight at
// (started before, its work not done before).
func (r *wfRun) causeOf(a *attempt) (fault, bool) {
	var out fault
	found := false
	for _, ft := range r.faults {
		at := ft.at.UnixNano()
		if at <= a.start || (found && !ft.at.Before(out.at)) {
			continue
		}
		hit := slices.Contains(ft.pids, a.pid)
		if len(ft.pids) == 0 && (ft.kind == faultServerKill || ft.kind == faultLeaderKill) {
			hit = a.end == 0 || a.end >= at
		}
		if hit {
			out, found = ft, true
		}
	}
	return out, found
}

// staleStarts reports runs a process started after a fault hit it.
func (r *wfRun) staleStarts(runs map[string][]*attempt, c *wfCounts) {
	for _, ft := range r.faults {
		for _, pid := range ft.pids {
			for _, as := range runs {
				for _, a := range as {
					if a.pid == pid && a.start > ft.at.UnixNano() {
						c.staleStarts++
						c.problems = append(c.problems, fmt.Sprintf("%s attempt %d started by %d after %s hit it", a.id, a.n, pid, ft.kind))
					}
				}
			}
		}
	}
}

// storedRuns maps every child and step of the run to the index in runs
// of the run whose outcome etcd stored, -1 when none matches: for a child
// its one success stored (attempt and pid in its result), for a step its
// record (its worker's pid and a start no later than the run's).
func (r *wfRun) storedRuns(ctx context.Context, runs map[string][]*attempt, c *wfCounts) map[string]int {
	out := map[string]int{}
	acks, problems, err := readAcks(ctx, r.cli, r.client, r.ns, "kids")
	if err != nil {
		r.t.Fatal(err)
	}
	c.problems = append(c.problems, problems...)
	store, err := task.NewStore(r.cli, r.ns)
	if err != nil {
		r.t.Fatal(err)
	}
	for _, p := range r.parents {
		for i := range r.children {
			id := task.ChildID(p, 1, fmt.Sprint(i))
			out[id] = -1
			ks := acks[id]
			if len(ks) != 1 {
				c.problems = append(c.problems, fmt.Sprintf("%s: %d successes stored %v, want 1", id, len(ks), ks))
				if len(ks) == 0 {
					continue
				}
			}
			out[id] = slices.IndexFunc(runs[id], func(a *attempt) bool { return a.n == ks[0].n && a.pid == ks[0].pid })
		}
		hist, err := store.History(ctx, p)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, s := range []string{"plan", "merge", "act"} {
			out[p+"/"+s] = -1
		}
		for _, h := range hist {
			pid := h.Worker[strings.LastIndexByte(h.Worker, ':')+1:] // "host:pid"
			out[p+"/"+h.Name] = slices.IndexFunc(runs[p+"/"+h.Name], func(a *attempt) bool {
				return fmt.Sprint(a.pid) == pid && a.start >= h.StartedAt.UnixNano()
			})
		}
	}
	return out
}

// planRecords counts the parents whose plan step has its record stored.
func (r *wfRun) planRecords() int {
	store, err := task.NewStore(r.cli, r.ns)
	if err != nil {
		r.t.Fatal(err)
	}
	n := 0
	for _, p := range r.parents {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		hist, _ := store.History(ctx, p)
		cancel()
		if slices.ContainsFunc(hist, func(h task.StepRecord) bool { return h.Name == "plan" }) {
			n++
		}
	}
	return n
}

// pickup returns the longest time a child of the run stayed PENDING
// before a worker claimed it, and which child.
func (r *wfRun) pickup() (time.Duration, string) {
	var slow time.Duration
	var which string
	for _, p := range r.parents {
		for i := range r.children {
			id := task.ChildID(p, 1, fmt.Sprint(i))
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			tk, err := r.client.Get(ctx, id)
			cancel()
			if err != nil {
				continue
			}
			var pending time.Time
			for _, tr := range tk.Transitions {
				if tr.Status == queue.Pending && pending.IsZero() {
					pending = tr.At
				}
				if tr.Status == queue.Running && !pending.IsZero() {
					if d := tr.At.Sub(pending); d > slow {
						slow, which = d, id
					}
					break
				}
			}
		}
	}
	return slow, which
}

// procState says whether and when wfworker pid ended.
func (r *wfRun) procState(pid int) string {
	for _, w := range r.procs {
		if w.pid == pid {
			if w.exited() {
				return fmt.Sprintf("its process exited with code %d at %s", w.exitCode(), w.ended.Format("15:04:05.000"))
			}
			return "its process runs"
		}
	}
	return "not a process of the run"
}
