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

// stopAll ends every wfworker with SIGCONT and SIGTERM and waits.
func (r *wfRun) stopAll() {
	for _, w := range r.procs {
		_ = w.signal(syscall.SIGCONT)
		_ = w.signal(syscall.SIGTERM)
	}
	for _, w := range r.procs {
		if !w.wait(15 * time.Second) {
			r.t.Errorf("wfworker %d did not stop within 15 s of SIGTERM", w.pid)
			w.kill()
		}
	}
}

// wfCounts is what a run of workflows did, counted from the runs log and
// etcd.
type wfCounts struct {
	childRuns, childrenTwice, childExcused int // runs; children run more than once; runs again excused
	stepRuns, stepsTwice, stepExcused      int
	staleStarts                            int // runs a process started after a fault hit it
	problems                               []string
}

// check counts the runs and checks every workflow: each parent SUCCEEDED
// with its children's count and its own signal; three step records; its
// signal consumed once and none left; the kids queue holds each child
// once, SUCCEEDED; each child and each step ran once, except a run in
// flight in a process a fault hit (it may run again: counted); no process
// started a run after a fault hit it.
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
		seen, err2 := r.cli.Get(ctx, keys.TaskSignalsSeen(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err1 != nil || err2 != nil || in.Count != 0 || seen.Count != 1 {
			bad("%s: signals left %v, consumed %v (%v %v): want 0 and 1", id, countOf(in), countOf(seen), err1, err2)
		}
	}
	if st, err := r.client.Stats(ctx, "kids"); err != nil || st.Succeeded != int64(len(r.parents)*r.children) || st.Total() != st.Succeeded {
		bad("kids: %+v (%v): want %d SUCCEEDED and nothing else", st, err, len(r.parents)*r.children)
	}
	r.countRuns(&c)
	return c
}

func taskState(tk *queue.Task) string {
	if tk == nil {
		return "none"
	}
	return fmt.Sprintf("%s %q (%s)", tk.CurrentStatus, tk.Result, tk.LastError)
}

func countOf(r *clientv3.GetResponse) int64 {
	if r == nil {
		return -1
	}
	return r.Count
}

// countRuns reads the runs log: every child and every step ran at least
// once, and each run before the last of its id was hit by a fault of its
// process after it started and before the next run started.
func (r *wfRun) countRuns(c *wfCounts) {
	runs, unread, err := readAttempts(r.log)
	if err != nil || unread != 0 {
		c.problems = append(c.problems, fmt.Sprintf("runs log: %d lines unread (%v)", unread, err))
	}
	hits, _ := queueFacts{faults: r.faults}.hits()
	want := map[string]bool{}
	for _, p := range r.parents {
		for _, s := range []string{"plan", "merge", "act"} {
			want[p+"/"+s] = true
		}
		for i := range r.children {
			want[task.ChildID(p, 1, fmt.Sprint(i))] = true
		}
	}
	ids := make([]string, 0, len(runs))
	for id := range runs {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		if !want[id] {
			c.problems = append(c.problems, fmt.Sprintf("%s ran, but is no child or step of the run", id))
		}
	}
	for id := range want {
		as := runs[id]
		step := strings.Contains(id, "/")
		if len(as) == 0 {
			c.problems = append(c.problems, fmt.Sprintf("%s never ran", id))
			continue
		}
		excused := 0
		for i, a := range as {
			if i == len(as)-1 {
				break
			}
			f, ok := causeOf(hits, a)
			if !ok || f.at.UnixNano() > as[i+1].start {
				c.problems = append(c.problems, fmt.Sprintf("%s ran again (attempt %d by %d started %s) with no fault hitting the run before (attempt %d by %d started %s, work done %t; %s)",
					id, as[i+1].n, as[i+1].pid, time.Unix(0, as[i+1].start).Format("15:04:05.000"), a.n, a.pid,
					time.Unix(0, a.start).Format("15:04:05.000"), a.end != 0, r.procState(a.pid)))
				continue
			}
			excused++
		}
		if step {
			c.stepRuns += len(as)
			c.stepExcused += excused
			if len(as) > 1 {
				c.stepsTwice++
			}
		} else {
			c.childRuns += len(as)
			c.childExcused += excused
			if len(as) > 1 {
				c.childrenTwice++
			}
		}
	}
	for _, ft := range r.faults {
		for _, pid := range ft.pids {
			for _, as := range runs {
				for _, a := range as {
					if a.pid == pid && a.start > ft.at.UnixNano() && (ft.kind != faultServerKill && ft.kind != faultLeaderKill) {
						c.staleStarts++
						c.problems = append(c.problems, fmt.Sprintf("%s attempt %d started by %d after %s hit it", a.id, a.n, pid, ft.kind))
					}
				}
			}
		}
	}
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
