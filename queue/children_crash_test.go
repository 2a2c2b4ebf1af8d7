package queue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// runChildHelper is a worker process for the child task crash tests:
//
//	children-submit: runs parents of queue "wf" (20 children each) and
//	    stops for good right after a parent's spawn is checkpointed,
//	    before its children are submitted;
//	children-wake: runs the children of queue "kids", logging each run
//	    to H_LOG, and stops for good once the last child's outcome is
//	    written, before its parent is woken.
//
// The test SIGKILLs it once it printed STOPPED.
func runChildHelper(mode string) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: strings.Split(os.Getenv("H_ENDPOINTS"), ",")})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer cli.Close()
	ns := os.Getenv("H_NS")
	keys := keyspace.MustNew(ns)
	stopped := func() {
		fmt.Println("STOPPED")
		select {} // until killed
	}
	q := "wf"
	if mode == "children-wake" {
		q = "kids"
	}
	queue.SetChildHooks(func(string) {
		if mode == "children-submit" {
			stopped()
		}
	}, func(parents []string) {
		if mode != "children-wake" {
			return
		}
		g, err := cli.Get(ctx, keys.ChildDones(parents[0], 1), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if err == nil && g.Count == 20 {
			stopped()
		}
	})
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: q, Concurrency: 8, TTL: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer w.Close(context.Background())
	store, _ := task.NewStore(cli, ns)
	f := newFamily(20)
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		if mode == "children-wake" {
			if err := appendLine(os.Getenv("H_LOG"), t.ID); err != nil {
				return nil, err
			}
			return t.Parameters, nil
		}
		return queue.Steps(store, f.parentSteps(t.ID)...)(ctx, t)
	})
	_ = w.Run(ctx)
	return 0
}

func appendLine(path, line string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = fmt.Fprintln(f, line)
	return err
}

// killChildHelperWhenStopped starts a helper process in mode and returns once it
// printed STOPPED, having killed it with SIGKILL.
func killChildHelperWhenStopped(t *testing.T, ns, mode, logPath string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"="+mode, "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns, "H_LOG="+logPath)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	seen := make(chan struct{})
	go func() {
		buf := make([]byte, 4096)
		var all strings.Builder
		for {
			n, err := out.Read(buf)
			all.Write(buf[:n])
			if strings.Contains(all.String(), "STOPPED") {
				close(seen)
				return
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-seen:
	case <-time.After(60 * time.Second):
		t.Fatalf("helper %s never stopped", mode)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
}

// A worker SIGKILLed right after a parent's spawn was checkpointed, before
// any child was submitted: the next worker does not run the spawning step
// again (it would return another list), submits the checkpointed list,
// each child runs once, and the parent resumes once.
func TestSpawnSurvivesKillAfterCheckpoint(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupFamily(t, c, "p")
	killChildHelperWhenStopped(t, ns, "children-submit", filepath.Join(t.TempDir(), "log"))
	ctx := context.Background()
	if st, _ := c.Stats(ctx, "kids"); st.Total() != 0 {
		t.Fatalf("children submitted before the kill: %+v", st)
	}
	f := newFamily(30) // a step run again would spawn 30
	f.start(t, cli, ns)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "20" {
		t.Fatalf("parent %s with %s (%s); want SUCCEEDED with the 20 checkpointed children", got.CurrentStatus, got.Result, got.LastError)
	}
	if a, b := f.runs(f.steps, "p/fan-out"), f.runs(f.steps, "p/fan-in"); a != 0 || b != 1 {
		t.Fatalf("after the kill, fan-out ran %d times and fan-in %d; want 0 and 1", a, b)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.kids) != 20 {
		t.Fatalf("%d children ran; want the 20 of the plan", len(f.kids))
	}
	for id, n := range f.kids {
		if n != 1 {
			t.Fatalf("child %s ran %d times", id, n)
		}
	}
}

// A children's worker SIGKILLed right after the last child's outcome was
// written, before it woke the parent: the parent resumes anyway, once, at
// its own next count, and each child ran once.
func TestSpawnSurvivesKillBeforeWake(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupFamily(t, c, "p")
	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	f := newFamily(20)
	parents := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", Concurrency: 2})
	parents.HandleAll(queue.Steps(store, f.parentSteps("p")...))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = parents.Run(ctx) }()
	defer func() { cancel(); wg.Wait() }()
	logPath := filepath.Join(t.TempDir(), "kids.log")
	killChildHelperWhenStopped(t, ns, "children-wake", logPath)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "20" {
		t.Fatalf("parent %s with %s (%s)", got.CurrentStatus, got.Result, got.LastError)
	}
	if a, b := f.runs(f.steps, "p/fan-out"), f.runs(f.steps, "p/fan-in"); a != 1 || b != 1 {
		t.Fatalf("fan-out ran %d times and fan-in %d; want once each", a, b)
	}
	b, _ := os.ReadFile(logPath)
	runs := map[string]int{}
	for _, id := range strings.Fields(string(b)) {
		runs[id]++
	}
	for i := range 20 {
		if id := task.ChildID("p", 1, fmt.Sprint(i)); runs[id] != 1 {
			t.Fatalf("child %s ran %d times; log %q", id, runs[id], b)
		}
	}
}
