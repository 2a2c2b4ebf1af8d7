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
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// runChildHelper is a worker process of queue "wf" (parents that spawn 20
// children each) for the child task crash tests:
//
//	children-submit: stops for good right after a parent's spawn is
//	    checkpointed, before its children are submitted;
//	children-wake: stops for good as it is about to wake a parent whose
//	    20 children all ended;
//	children-cancel: cancels task p and stops for good before the cancel
//	    cascades to p's children;
//	children-dead: runs parents that spawn failFastChildren and stops for
//	    good once a parent's death is written, before its cascade.
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
	stopped := func() {
		fmt.Println("STOPPED")
		select {} // until killed
	}
	switch mode {
	case "children-cancel": // stops between the cancel of p and its cascade
		queue.SetCancelHook(func(string) { stopped() })
		c, err := queue.NewClient(cli, ns)
		if err == nil {
			_, err = c.Cancel(ctx, "p")
		}
		fmt.Fprintln(os.Stderr, "cancel returned:", err)
		return 2
	case "children-dead": // stops between p's death and its cascade
		queue.SetCascadeRunHook(func(string) { stopped() })
	}
	queue.SetChildHooks(func(string) {
		switch mode {
		case "children-submit":
			stopped()
		case "children-pause": // the test stops the process here, past its TTL
			fmt.Println("STOPPED")
			time.Sleep(time.Second)
			_ = appendLine(os.Getenv("H_LOG"), "victim continued")
		}
	}, func(string) bool {
		if mode == "children-wake" {
			stopped()
		}
		return true
	}, nil)
	w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", Concurrency: 8, TTL: 2 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer w.Close(context.Background())
	store, _ := task.NewStore(cli, ns)
	f := newFamily(20)
	if mode == "children-dead" {
		f.children = failFastChildren
	}
	w.HandleAll(func(ctx context.Context, t *queue.Task) ([]byte, error) {
		_ = appendLine(os.Getenv("H_LOG"), "victim "+t.ID)
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
	cmd := startChildHelper(t, ns, mode, logPath, syscall.SIGKILL)
	_ = cmd.Wait()
}

// startChildHelper starts a helper process in mode and returns it once it
// printed STOPPED, having sent it sig.
func startChildHelper(t *testing.T, ns, mode, logPath string, sig syscall.Signal) *exec.Cmd {
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
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
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
	_ = cmd.Process.Signal(sig)
	return cmd
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

// A parents' worker SIGKILLed as it was about to wake a parent whose
// children all ended (the last child's outcome and the parent's wake mark
// are written): another worker of the parents' queue wakes it from the
// mark, the parent resumes once, and each child ran once.
func TestSpawnSurvivesKillBeforeWake(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupFamily(t, c, "p")
	ctx := context.Background()
	f := newFamily(20)
	// The children end only once their parent is parked, so that its
	// wake is the waker's, in the helper.
	f.child = func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		for {
			if p, err := c.Get(ctx, "p"); err == nil && p.CurrentStatus == queue.Waiting {
				return tk.Parameters, nil
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	kids := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "kids", Concurrency: 32})
	kids.HandleAll(func(ctx context.Context, tk *queue.Task) ([]byte, error) {
		f.count(f.kids, tk.ID)
		return f.child(ctx, tk)
	})
	kctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = kids.Run(kctx) }()
	defer func() { cancel(); wg.Wait() }()
	logPath := filepath.Join(t.TempDir(), "log")
	killChildHelperWhenStopped(t, ns, "children-wake", logPath)
	if p, err := c.Get(ctx, "p"); err != nil || p.CurrentStatus != queue.Waiting {
		t.Fatalf("parent after the kill: %+v (%v); want WAITING", p, err)
	}

	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	parents := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "wf", Concurrency: 2})
	parents.HandleAll(queue.Steps(store, f.parentSteps("p")...))
	wg.Add(1)
	go func() { defer wg.Done(); _ = parents.Run(kctx) }()
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "20" {
		t.Fatalf("parent %s with %s (%s)", got.CurrentStatus, got.Result, got.LastError)
	}
	if a, b := f.runs(f.steps, "p/fan-out"), f.runs(f.steps, "p/fan-in"); a != 0 || b != 1 {
		t.Fatalf("after the kill fan-out ran %d times and fan-in %d; want 0 and 1", a, b)
	}
	if b, _ := os.ReadFile(logPath); strings.Count(string(b), "victim p") != 1 {
		t.Fatalf("the helper ran the parent %q; want once (the spawn)", b)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.kids) != 20 {
		t.Fatalf("%d children ran", len(f.kids))
	}
	for id, n := range f.kids {
		if n != 1 {
			t.Fatalf("child %s ran %d times", id, n)
		}
	}
}

// A parent's worker paused (SIGSTOP) past its TTL right after the spawn was
// checkpointed: another worker takes the parent over, submits the
// checkpointed children, and the parent resumes and finishes. The paused
// worker, continued, submits the same children again (nothing new: the
// ids are taken) and its writes under its lost claim are refused: each
// child ran once, and the parent resumed once.
func TestSpawnWorkerPausedAfterCheckpoint(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	setupFamily(t, c, "p")
	logPath := filepath.Join(t.TempDir(), "log")
	victim := startChildHelper(t, ns, "children-pause", logPath, syscall.SIGSTOP)
	f := newFamily(30) // a step run again would spawn 30
	f.start(t, cli, ns)
	got := waitFinished(t, c, "p")
	if got.CurrentStatus != queue.Succeeded || string(got.Result) != "20" {
		t.Fatalf("parent %s with %s (%s)", got.CurrentStatus, got.Result, got.LastError)
	}
	_ = victim.Process.Signal(syscall.SIGCONT)
	waitUntil(t, "the paused worker to go on", func() bool {
		b, _ := os.ReadFile(logPath)
		return strings.Contains(string(b), "victim continued")
	})
	// A stopping worker waits for its handlers: once it exited, its
	// submission and its refused writes were made.
	_ = victim.Process.Signal(syscall.SIGTERM)
	_, _ = victim.Process.Wait()
	after, err := c.Get(context.Background(), "p")
	if err != nil || after.CurrentStatus != queue.Succeeded || after.Attempt != got.Attempt || string(after.Result) != "20" {
		t.Fatalf("parent after the paused worker went on: %+v (%v)", after, err)
	}
	if a, b := f.runs(f.steps, "p/fan-out"), f.runs(f.steps, "p/fan-in"); a != 0 || b != 1 {
		t.Fatalf("fan-out ran %d times here and fan-in %d; want 0 and 1", a, b)
	}
	if st, _ := c.Stats(context.Background(), "kids"); st.Total() != 20 {
		t.Fatalf("kids: %+v; want the 20 children of the plan", st)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, n := range f.kids {
		if n != 1 {
			t.Fatalf("child %s ran %d times", id, n)
		}
	}
	if len(f.kids) != 20 {
		t.Fatalf("%d children ran", len(f.kids))
	}
}
