package queue_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitStepsLogged are three steps that log "worker step task signal" to
// logPath when they start: s1 waits for the signal "approval", s2 (which
// logs the signal's idempotency key) blocks until its context ends when
// block is "block", or works 4 s without heeding it and logs "s2-done"
// when block is "pause", s3 ends the task.
func waitStepsLogged(logPath, worker string, block string) []task.Step {
	logLine := func(ctx context.Context, step string) error {
		sig := "-"
		if sg, ok := task.ReceivedSignal(ctx); ok {
			sig = sg.IdempotencyKey
		}
		f, err := os.OpenFile(logPath, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = fmt.Fprintf(f, "%s %s %s %s\n", worker, step, queue.TaskIDOf(ctx), sig)
		return err
	}
	return []task.Step{
		{Name: "s1", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			if err := logLine(ctx, "s1"); err != nil {
				return nil, err
			}
			return []byte("s1"), task.WaitSignal("approval", 0)
		}},
		{Name: "s2", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			if err := logLine(ctx, "s2"); err != nil {
				return nil, err
			}
			switch block {
			case "block":
				<-ctx.Done()
				return nil, ctx.Err()
			case "pause": // as a blocking LLM call: its result comes whatever happened meanwhile
				time.Sleep(4 * time.Second)
				if err := logLine(ctx, "s2-done"); err != nil {
					return nil, err
				}
			}
			return append(s, "|s2"...), nil
		}},
		{Name: "s3", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			return append(s, "|s3"...), logLine(ctx, "s3")
		}},
	}
}

// logCount counts the lines of logPath with the given fields (""
// matches any).
func logCount(logPath string, fields ...string) int {
	b, _ := os.ReadFile(logPath)
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) < len(fields) {
			continue
		}
		ok := true
		for i, want := range fields {
			if want != "" && f[i] != want {
				ok = false
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// startWaitVictim starts a worker process of queue "jobs" running
// waitStepsLogged as "victim".
func startWaitVictim(t *testing.T, ns, logPath, block string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=waits", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns, "H_LOG="+logPath,
		"H_CONCURRENCY=8", "H_TTL=2s")
	cmd.Env = append(cmd.Env, "H_BLOCK="+block)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// checkResumedOnce asserts, for every task of ids: s1 ran once, s3 once,
// s2 between once and maxS2 times, always with the signal sent to it;
// step 2's record was written once; the signal was consumed once (one
// tombstone, nothing left in the inbox).
func checkResumedOnce(t *testing.T, cli *clientv3.Client, c *queue.Client, ns, logPath string, ids []string, maxS2 int) {
	t.Helper()
	ctx := context.Background()
	keys := keyspace.MustNew(ns)
	store, _ := task.NewStore(cli, ns)
	for _, id := range ids {
		got, err := c.Get(ctx, id)
		if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != "s1|s2|s3" {
			t.Fatalf("%s: %+v (%v): want SUCCEEDED s1|s2|s3", id, got, err)
		}
		s1, s2, s3 := logCount(logPath, "", "s1", id), logCount(logPath, "", "s2", id), logCount(logPath, "", "s3", id)
		if s1 != 1 || s3 != 1 || s2 < 1 || s2 > maxS2 || logCount(logPath, "", "s2", id, "sig-"+id) != s2 {
			t.Fatalf("%s: s1 ran %d, s2 %d (%d with its signal), s3 %d: want 1, 1..%d (all), 1", id, s1, s2, logCount(logPath, "", "s2", id, "sig-"+id), s3, maxS2)
		}
		hist, _ := store.History(ctx, id)
		if len(hist) != 3 {
			t.Fatalf("%s: %d step records, want 3", id, len(hist))
		}
		in, _ := cli.Get(ctx, keys.TaskSignals(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		seen, _ := cli.Get(ctx, keys.TaskSignalsSeen(id), clientv3.WithPrefix(), clientv3.WithCountOnly())
		if in.Count != 0 || seen.Count != 1 {
			t.Fatalf("%s: %d signals left in the inbox, %d consumed: want 0 and 1", id, in.Count, seen.Count)
		}
	}
}

// A worker process parks waiting tasks; it is SIGKILLed as the signals
// arrive (some tasks woken and claimed by it, some resuming, some still
// parked); another worker resumes every task: each resumes exactly once
// (step 3 once, step 2's checkpoint once; only a step 2 in flight at the
// kill runs twice) and each signal is consumed once.
func TestWaitWorkerKilledAsSignalsArrive(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "steps.log")
	var ids []string
	var ts []queue.Task
	for i := range 8 {
		ids = append(ids, fmt.Sprintf("wf-%d", i))
		ts = append(ts, queue.Task{ID: ids[i], Type: "agent"})
	}
	if _, err := c.Submit(context.Background(), "jobs", ts, nil); err != nil {
		t.Fatal(err)
	}
	victim := startWaitVictim(t, ns, logPath, "block")
	ctx := context.Background()
	waitUntil(t, "every task to wait", func() bool {
		st, err := c.Stats(ctx, "jobs")
		return err == nil && st.Waiting == int64(len(ids))
	})
	for i, id := range ids {
		if _, err := c.Signal(ctx, id, "approval", nil, "sig-"+id); err != nil {
			t.Fatal(err)
		}
		if i == len(ids)/2 { // half sent: the victim resumes the first ones
			waitUntil(t, "the victim to resume a task", func() bool { return logCount(logPath, "victim", "s2") > 0 })
		}
	}
	_ = victim.Process.Signal(syscall.SIGKILL)
	_ = victim.Wait()
	t.Logf("the victim was running step 2 of %d tasks when it was killed", logCount(logPath, "victim", "s2"))
	store, _ := task.NewStore(cli, ns)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 8})
	w.HandleAll(queue.Steps(store, waitStepsLogged(logPath, "rescuer", "")...))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = w.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	for _, id := range ids {
		if _, err := c.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	checkResumedOnce(t, cli, c, ns, logPath, ids, 2)
}

// A worker process SIGKILLed while its tasks wait holds nothing: the
// signals sent after its death wake the tasks, another worker resumes
// each once, and the victim never ran step 2.
func TestWaitWorkerKilledWhileTasksWait(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "steps.log")
	ids := []string{"wk-0", "wk-1", "wk-2"}
	var ts []queue.Task
	for _, id := range ids {
		ts = append(ts, queue.Task{ID: id, Type: "agent"})
	}
	if _, err := c.Submit(context.Background(), "jobs", ts, nil); err != nil {
		t.Fatal(err)
	}
	victim := startWaitVictim(t, ns, logPath, "")
	ctx := context.Background()
	waitUntil(t, "every task to wait", func() bool {
		st, err := c.Stats(ctx, "jobs")
		return err == nil && st.Waiting == int64(len(ids))
	})
	_ = victim.Process.Signal(syscall.SIGKILL)
	_ = victim.Wait()
	for _, id := range ids {
		res, err := c.Signal(ctx, id, "approval", nil, "sig-"+id)
		if err != nil || !res.Woke {
			t.Fatalf("signal %s: %+v, %v: want it to wake the task", id, res, err)
		}
	}
	store, _ := task.NewStore(cli, ns)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs"})
	w.HandleAll(queue.Steps(store, waitStepsLogged(logPath, "rescuer", "")...))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = w.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	start := time.Now()
	for _, id := range ids {
		if _, err := c.Wait(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("resumed in %s after the victim's death", time.Since(start))
	if n := logCount(logPath, "victim", "s2"); n != 0 {
		t.Fatalf("the victim ran step 2 %d times after its death", n)
	}
	checkResumedOnce(t, cli, c, ns, logPath, ids, 1)
}

// A worker process paused (SIGSTOP) past its TTL while the step that
// received a signal runs, then continued: another worker took the task
// over meanwhile and finished it, consuming the signal; the paused
// worker's step ends afterwards, and its checkpoint, which would consume
// the signal again, is refused. The task resumed once, the signal was
// consumed once.
func TestWaitWorkerPausedAsItResumes(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "steps.log")
	id := "wp-0"
	if _, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: id, Type: "agent"}}, nil); err != nil {
		t.Fatal(err)
	}
	victim := startWaitVictim(t, ns, logPath, "pause")
	ctx := context.Background()
	waitStatus(t, c, id, queue.Waiting)
	if _, err := c.Signal(ctx, id, "approval", nil, "sig-"+id); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the victim to resume the task", func() bool { return logCount(logPath, "victim", "s2", id) == 1 })
	_ = victim.Process.Signal(syscall.SIGSTOP)
	store, _ := task.NewStore(cli, ns)
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs"})
	w.HandleAll(queue.Steps(store, waitStepsLogged(logPath, "rescuer", "")...))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { _ = w.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	if _, err := c.Wait(ctx, id); err != nil { // the victim's lease (2 s) ends, the rescuer takes over
		t.Fatal(err)
	}
	_ = victim.Process.Signal(syscall.SIGCONT)
	waitUntil(t, "the victim's step to end", func() bool { return logCount(logPath, "victim", "s2-done", id) == 1 })
	// Its checkpoint attempt follows the log line; a stopping worker
	// waits for its handlers, so once it exited the attempt was made.
	_ = victim.Process.Signal(syscall.SIGTERM)
	_ = victim.Wait()
	if n := logCount(logPath, "victim", "s3"); n != 0 {
		t.Fatalf("the paused victim ran step 3 %d times", n)
	}
	checkResumedOnce(t, cli, c, ns, logPath, []string{id}, 2)
}
