package queue_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// startLoggingWorker starts a worker process of mode ("block" or "slow")
// with the given concurrency and returns it with its standard output.
func startLoggingWorker(t *testing.T, ns, mode string, concurrency int) (*exec.Cmd, io.Reader) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns,
		"H_CONCURRENCY="+strconv.Itoa(concurrency))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd, out
}

// backlogSize is the backlog of TestDeadWorkerTasksRunAgainWithinTTL:
// 100,000 tasks, or DROVER_TEST_BACKLOG.
func backlogSize(t *testing.T) int {
	if v := os.Getenv("DROVER_TEST_BACKLOG"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1000 {
			t.Fatalf("DROVER_TEST_BACKLOG=%q: want a number of at least 1000", v)
		}
		return n
	}
	return 100000
}

// TestDeadWorkerTasksRunAgainWithinTTL: with a large backlog, a worker
// holding 32 tasks (a run of part of a segment) is killed with SIGKILL; two
// other workers of 8 slots each, busy with the backlog's tasks of 50 ms,
// must start each of its tasks again within the lease's TTL (2 s) plus
// 1 s, and no other task a second time. Their 16 slots run the 32 tasks in
// 100 ms, so the bound measures how soon they learn of the dead claims and
// claim the tasks, not how long the tasks queue for a slot. They learn of
// the dead claims from the watch on their deletion, not by reading the
// open segments in turn, which in a backlog of this size takes seconds.
func TestDeadWorkerTasksRunAgainWithinTTL(t *testing.T) {
	const ttl = 2 * time.Second
	n := backlogSize(t)
	ns := etcdtest.Namespace(t)
	c, _ := newClient(t, ns)
	began := time.Now()
	if res, err := c.Submit(context.Background(), "jobs", tasks(n, "work"), nil); err != nil || res.Submitted != n {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	t.Logf("submitted %d tasks in %s", n, time.Since(began).Round(time.Millisecond))

	victim, vout := startLoggingWorker(t, ns, "block", 32)
	held := map[string]bool{}
	sc := bufio.NewScanner(vout)
	for len(held) < 32 && sc.Scan() {
		if id, ok := strings.CutPrefix(sc.Text(), "STARTED "); ok {
			held[id] = true
		}
	}
	if len(held) < 32 {
		t.Fatalf("the victim started %d tasks, want 32", len(held))
	}
	restarts := make(chan [2]string, 4096) // id, start time of attempts ≥ 2
	var survivors []*exec.Cmd
	for range 2 {
		w, out := startLoggingWorker(t, ns, "slow", 8)
		survivors = append(survivors, w)
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				f := strings.Fields(sc.Text())
				if len(f) == 4 && f[0] == "START" && f[2] != "1" {
					select {
					case restarts <- [2]string{f[1], f[3]}:
					default:
					}
				}
			}
		}()
	}
	time.Sleep(3 * time.Second) // the survivors are busy with the backlog
	killed := time.Now()
	if err := victim.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var delays []time.Duration
	deadline := time.After(ttl + 20*time.Second)
	want := len(held)
	for len(delays) < want {
		select {
		case r := <-restarts:
			if !held[r[0]] {
				// Only the dead worker's tasks come back, each once.
				t.Fatalf("task %s ran a second attempt, but the dead worker did not hold it (or it came back twice)", r[0])
			}
			delete(held, r[0])
			ns, _ := strconv.ParseInt(r[1], 10, 64)
			delays = append(delays, time.Unix(0, ns).Sub(killed))
		case <-deadline:
			t.Fatalf("%d of the dead worker's 32 tasks did not run again within %s (delays so far %v)", len(held), ttl+20*time.Second, delays)
		}
	}
	slices.Sort(delays)
	p50, p99 := delays[len(delays)/2], delays[len(delays)*99/100]
	t.Logf("backlog %d: the dead worker's tasks ran again after p50 %s, p99 %s, max %s (TTL %s)", n, p50.Round(time.Millisecond), p99.Round(time.Millisecond), delays[len(delays)-1].Round(time.Millisecond), ttl)
	if p99 > ttl+time.Second {
		t.Fatalf("p99 %s, want at most TTL + 1 s = %s; all delays %v", p99, ttl+time.Second, delays)
	}
	// The backlog can be walked page by page: stop the workers, let their
	// claims expire, and list every pending task once.
	for _, w := range survivors {
		_ = w.Process.Kill()
		_ = w.Wait()
	}
	time.Sleep(ttl + time.Second)
	st, err := c.Stats(context.Background(), "jobs")
	if err != nil || st.Pending < int64(n/2) || st.Running != 0 {
		t.Fatalf("stats %+v (%v): the backlog should still be there, nothing running", st, err)
	}
	began = time.Now()
	if ids := walk(t, c, "jobs", queue.Pending, queue.MaxListLimit); int64(len(ids)) != st.Pending {
		t.Fatalf("walked %d pending tasks, stats say %d", len(ids), st.Pending)
	}
	t.Logf("walked %d pending tasks in pages of %d in %s", st.Pending, queue.MaxListLimit, time.Since(began).Round(time.Millisecond))
}

// TestKilledAttemptInHistory: the attempt of a worker killed with SIGKILL
// left no outcome; the history of the task still shows it, as a RUNNING
// transition marked lost, before the attempt that succeeded.
func TestKilledAttemptInHistory(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", tasks(1, "work"), nil); err != nil {
		t.Fatal(err)
	}
	victim, out := startLoggingWorker(t, ns, "block", 1)
	if sc := bufio.NewScanner(out); !sc.Scan() || !strings.HasPrefix(sc.Text(), "STARTED ") {
		t.Fatal("the victim did not start the task")
	}
	_ = victim.Process.Signal(syscall.SIGKILL)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true})
	w.HandleAll(func(context.Context, *queue.Task) ([]byte, error) { return nil, nil })
	runDrain(t, w)
	got, err := c.Get(context.Background(), "t-00000")
	if err != nil {
		t.Fatal(err)
	}
	var seq []string
	for _, tr := range got.Transitions {
		seq = append(seq, fmt.Sprintf("%s/%d/%t", tr.Status, tr.Attempt, strings.HasPrefix(tr.Error, "lost")))
	}
	if want := "PENDING/0/false RUNNING/1/true RUNNING/2/false SUCCEEDED/2/false"; strings.Join(seq, " ") != want {
		t.Fatalf("history %v, want %s", seq, want)
	}
}
