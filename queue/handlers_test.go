package queue_test

import (
	"bufio"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/proc"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

func readPid(t *testing.T, path string) int {
	t.Helper()
	var pid int
	deadline := time.Now().Add(10 * time.Second)
	for pid == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the task's process never started")
		}
		b, _ := os.ReadFile(path)
		pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		time.Sleep(20 * time.Millisecond)
	}
	return pid
}

func TestExecHandler(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	dir := t.TempDir()
	zero := 0
	in := []queue.Task{
		{ID: "ok", Type: "ok", Parameters: []byte(`{"word":"hello"}`)},
		{ID: "slow", Type: "slow", Timeout: queue.Duration(300 * time.Millisecond), MaxRetries: &zero},
		{ID: "loud", Type: "loud"},
		{ID: "bad-data", Type: "perm"},
		{ID: "flaky", Type: "fail", MaxRetries: &zero},
	}
	if _, err := c.Submit(context.Background(), "jobs", in, nil); err != nil {
		t.Fatal(err)
	}
	script := `case "$DROVER_TASK_TYPE" in
ok) cat ;;
slow) echo $$ > ` + filepath.Join(dir, "slow.pid") + `; exec sleep 30 ;;
loud) head -c 100000000 /dev/zero ;;
perm) echo "not a PDF" >&2; exit 65 ;;
fail) echo "upstream 503" >&2; exit 3 ;;
esac`
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Concurrency: 5, Drain: true})
	w.HandleAll(queue.ExecHandler([]string{"sh", "-c", script}, 0, 200*time.Millisecond, nil))
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			var m runtime.MemStats
			runtime.ReadMemStats(&m)
			peak = max(peak, m.HeapAlloc)
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	runDrain(t, w)
	close(stop)
	wg.Wait()

	get := func(id string) *queue.Task {
		got, err := c.Get(context.Background(), id)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	if ok := get("ok"); ok.CurrentStatus != queue.Succeeded || !strings.Contains(string(ok.Result), `"word":"hello"`) {
		t.Fatalf("ok: %s, result %q", ok.CurrentStatus, ok.Result)
	}
	slow := get("slow")
	if slow.CurrentStatus != queue.Dead || !strings.Contains(slow.LastError, "timed out") {
		t.Fatalf("slow: %s, %q", slow.CurrentStatus, slow.LastError)
	}
	if pid := readPid(t, filepath.Join(dir, "slow.pid")); proc.Alive(pid) {
		t.Fatalf("the timed-out task's process %d is still running", pid)
	}
	loud := get("loud")
	if loud.CurrentStatus != queue.Dead || !strings.Contains(loud.LastError, "100000000 bytes") || len(loud.Result) != 0 {
		t.Fatalf("loud: %s, %q", loud.CurrentStatus, loud.LastError)
	}
	// The etcd server shares this heap, so allow it some room; reading the
	// output into memory would add at least the 100 MB.
	if grew := int64(peak) - int64(before.HeapAlloc); grew > 64<<20 {
		t.Fatalf("the heap grew by %d MiB while a task printed 100 MB", grew>>20)
	}
	if p := get("bad-data"); p.CurrentStatus != queue.Dead || p.Attempt != 1 || !strings.Contains(p.LastError, "not a PDF") {
		t.Fatalf("exit 65: %+v", p)
	}
	if f := get("flaky"); f.CurrentStatus != queue.Dead || !strings.Contains(f.LastError, "upstream 503") {
		t.Fatalf("exit 3 with no retries left: %s %q", f.CurrentStatus, f.LastError)
	}
}

// A worker whose lease is lost (its claims with it) kills its tasks'
// processes at once.
func TestExecHandlerKilledOnClaimLoss(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	dir := t.TempDir()
	if _, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: "long", Type: "long"}}, nil); err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs"})
	w.HandleAll(queue.ExecHandler([]string{"sh", "-c", "echo $$ > " + filepath.Join(dir, "pid") + "; exec sleep 30"}, 0, 200*time.Millisecond, nil))
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	pid := readPid(t, filepath.Join(dir, "pid"))
	if _, err := cli.Revoke(context.Background(), w.Lease().ID()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("worker still running after its lease was revoked")
	}
	deadline := time.Now().Add(5 * time.Second)
	for proc.Alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d outlived the lost claim", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A dead worker's tasks are claimable again within TTL + 1 s, with no reaper.
func TestDeadWorkersTasksReturn(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	if _, err := c.Submit(context.Background(), "jobs", tasks(5, "work"), nil); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=block", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns)
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	sc := bufio.NewScanner(out)
	for started := 0; started < 5 && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "STARTED") {
			started++
		}
	}
	if st, _ := c.Stats(context.Background(), "jobs"); st.Running != 5 {
		t.Fatalf("stats %+v, want 5 running", st)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	var mu sync.Mutex
	var first time.Duration
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true})
	w.HandleAll(func(ctx context.Context, task *queue.Task) ([]byte, error) {
		mu.Lock()
		if first == 0 {
			first = time.Since(killed)
		}
		mu.Unlock()
		if task.Attempt != 2 {
			t.Errorf("task %s attempt %d, want 2", task.ID, task.Attempt)
		}
		return nil, nil
	})
	runDrain(t, w)
	t.Logf("tasks claimable again %s after SIGKILL (TTL 2s)", first.Round(time.Millisecond))
	if first > 3*time.Second {
		t.Fatalf("the first task came back %s after SIGKILL, want within TTL + 1s", first)
	}
	if st, _ := c.Stats(context.Background(), "jobs"); st.Succeeded != 5 {
		t.Fatalf("stats %+v", st)
	}
}
