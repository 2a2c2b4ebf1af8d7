package queue_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
)

// A queued agent task whose worker is killed during step 2 resumes at step 2
// on another worker: step 1, checkpointed under the first claim, never runs
// again. This is the task runner's step-wise resume, fenced by queue claims.
func TestStepsResumeAfterWorkerDies(t *testing.T) {
	ns := etcdtest.Namespace(t)
	c, cli := newClient(t, ns)
	logPath := filepath.Join(t.TempDir(), "steps.log")
	if _, err := c.Submit(context.Background(), "jobs", []queue.Task{{ID: "report", Type: "agent", Parameters: []byte(`"in"`)}}, nil); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=steps", "H_ENDPOINTS="+strings.Join(srv.Endpoints(), ","), "H_NS="+ns, "H_LOG="+logPath)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(20 * time.Second)
	for {
		b, _ := os.ReadFile(logPath)
		if strings.Contains(string(b), "victim s2") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("step 2 never started; log %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	store, err := task.NewStore(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(t, cli, queue.WorkerConfig{Namespace: ns, Queue: "jobs", Drain: true})
	w.HandleAll(queue.Steps(store, stepsLogged(logPath, "rescuer", 0)...))
	runDrain(t, w)

	b, _ := os.ReadFile(logPath)
	if got := strings.Fields(strings.ReplaceAll(string(b), "\n", " ; ")); strings.Join(got, " ") != "victim s1 ; victim s2 ; rescuer s2 ; rescuer s3 ;" {
		t.Fatalf("steps ran %q; want s1 once, s2 twice (the one in flight), s3 once", b)
	}
	got, err := c.Get(context.Background(), "report")
	if err != nil || got.CurrentStatus != queue.Succeeded || string(got.Result) != `"in"|s1|s2|s3` || got.Attempt != 2 {
		t.Fatalf("task %+v (%v)", got, err)
	}
	hist, _ := store.History(context.Background(), "report")
	if len(hist) != 3 || hist[0].Worker == hist[1].Worker || hist[1].Token <= hist[0].Token {
		t.Fatalf("step records %+v: want step 1 under the first claim, steps 2-3 under the second", hist)
	}
}
