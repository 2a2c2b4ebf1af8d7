package queue_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// startWorkerProcess starts a worker process that drains the queue "jobs".
func startWorkerProcess(t *testing.T, ns string) *exec.Cmd {
	t.Helper()
	cmd, _ := startLoggingWorker(t, ns, "worker", 32)
	return cmd
}

// TestWorkersKilledWhileProcessing runs 10,000 tasks through three worker
// processes while one of them is killed with SIGKILL every second and
// replaced. Every task must end SUCCEEDED exactly once: its done key written
// once (version 1), nothing left pending, running or retrying.
func TestWorkersKilledWhileProcessing(t *testing.T) {
	const n = 10000
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if res, err := c.Submit(context.Background(), "jobs", tasks(n, "work"), nil); err != nil || res.Submitted != n {
		t.Fatalf("submit: %+v, %v", res, err)
	}
	workers := []*exec.Cmd{startWorkerProcess(t, ns), startWorkerProcess(t, ns), startWorkerProcess(t, ns)}
	rng := rand.New(rand.NewPCG(7, 7))
	kills := 0
	deadline := time.Now().Add(4 * time.Minute)
	for kills < 6 && time.Now().Before(deadline) {
		time.Sleep(time.Second)
		st, err := c.Stats(context.Background(), "jobs")
		if err != nil {
			t.Fatal(err)
		}
		if st.Succeeded > n*9/10 {
			break
		}
		i := rng.IntN(len(workers))
		_ = workers[i].Process.Signal(syscall.SIGKILL)
		_ = workers[i].Wait()
		kills++
		workers[i] = startWorkerProcess(t, ns)
	}
	t.Logf("killed %d workers with SIGKILL", kills)
	for _, w := range workers {
		done := make(chan error, 1)
		go func() { done <- w.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("worker exited with %v", err)
			}
		case <-time.After(2 * time.Minute):
			st, _ := c.Stats(context.Background(), "jobs")
			t.Fatalf("workers did not drain; stats %+v", st)
		}
	}
	st, err := c.Stats(context.Background(), "jobs")
	if err != nil || st.Succeeded != n || st.Total() != n {
		t.Fatalf("stats %+v (%v), want %d succeeded and nothing else", st, err, n)
	}
	keys := keyspace.MustNew(ns)
	ids := succeededIDs(t, c, cli, ns, "jobs")
	if len(ids) != n {
		t.Fatalf("%d tasks recorded as succeeded, want %d", len(ids), n)
	}
	for id, k := range ids {
		if k != 1 {
			t.Fatalf("%s was recorded as SUCCEEDED %d times", id, k)
		}
	}
	for _, p := range []string{keys.QueuePending("jobs"), keys.QueueClaims("jobs"), keys.QueueRetry("jobs"), keys.QueueDead("jobs"), keys.Runs("jobs", ""), keys.SegmentsOpen("jobs")} {
		if g, _ := cli.Get(context.Background(), p, clientv3.WithPrefix(), clientv3.WithCountOnly()); g.Count != 0 {
			t.Fatalf("%d keys left under %s", g.Count, p)
		}
	}
	// Spot-check records: one SUCCEEDED transition, and the result is the
	// task's own.
	for i := 0; i < n; i += 997 {
		got, err := c.Get(context.Background(), fmt.Sprintf("t-%05d", i))
		if err != nil {
			t.Fatal(err)
		}
		succ := 0
		for _, tr := range got.Transitions {
			if tr.Status == queue.Succeeded {
				succ++
			}
		}
		if succ != 1 || string(got.Result) != got.ID {
			t.Fatalf("task %s: %d SUCCEEDED transitions, result %q", got.ID, succ, got.Result)
		}
	}
}
