package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/queue"
)

// drover task run, exec steps that spawn children: step 1 writes three
// children to DROVER_SPAWN_FILE; the run checkpoints them, submits them
// and exits 75 holding nothing; a run before they ended runs nothing,
// spawns nothing and exits 75 again; once a worker ran them, the next run
// resumes at step 2, which reads their outcomes from DROVER_CHILDREN_FILE.
// Each step runs once and each child once. Without collect, a dead child
// fails the run, naming it; a queue that does not exist fails the step,
// naming the file and the field, and checkpoints nothing.
func TestTaskRunExecStepSpawnsChildren(t *testing.T) {
	ns := etcdtest.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	cli := srv.Client(t)
	c, err := queue.NewClient(cli, ns)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close(ctx)
	// The queue exists once a task was submitted to it.
	if _, err := c.Submit(ctx, "sq", []queue.Task{{ID: "seed", Type: "sq", Parameters: json.RawMessage(`{"i":0}`)}}, nil); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex // handlers run side by side
	runs := map[string]int{}
	work := func() { // runs sq's tasks until none is left
		t.Helper()
		w, err := queue.NewWorker(ctx, cli, queue.WorkerConfig{Namespace: ns, Queue: "sq", Drain: true})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Close(ctx)
		w.Handle("sq", func(_ context.Context, tk *queue.Task) ([]byte, error) {
			mu.Lock()
			runs[tk.ID]++
			mu.Unlock()
			var p struct{ I int }
			_ = json.Unmarshal(tk.Parameters, &p)
			if p.I < 0 {
				return nil, queue.Permanent(errors.New("negative input"))
			}
			return json.Marshal(map[string]int{"sq": p.I * p.I})
		})
		if err := w.Run(ctx); err != nil {
			t.Fatal(err)
		}
	}
	work()

	dir := t.TempDir()
	log := filepath.Join(dir, "steps.log")
	plan := `echo plan >> ` + log + `; printf planned; echo '{"children": [{"queue": "sq", "task_type": "sq", "parameters": {"i": 2}, "key": "a"},` +
		` {"queue": "sq", "task_type": "sq", "parameters": {"i": 3}, "key": "b"}, {"queue": "sq", "task_type": "sq", "parameters": {"i": 4}, "key": "c", "detached": true}]}' > "$DROVER_SPAWN_FILE"`
	merge := `echo merge >> ` + log + `; printf '%s|' "$(cat)"; cat "$DROVER_CHILDREN_FILE"`
	run := func(id string) result {
		return drover(t, append(etcdFlags(ns), "task", "run", id, "--step", "plan="+plan, "--step", "merge="+merge)...)
	}
	r := run("fan-1")
	if r.code != 75 || !strings.Contains(r.stderr, "waits for 3 of the 3 children of step 1") {
		t.Fatalf("first run: %d %q %q", r.code, r.stdout, r.stderr)
	}
	if r = run("fan-1"); r.code != 75 {
		t.Fatalf("a run before the children ended: %d %q %q", r.code, r.stdout, r.stderr)
	}
	work()
	r = run("fan-1")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "planned|[") {
		t.Fatalf("run after the children: %d %q %q", r.code, r.stdout, r.stderr)
	}
	var outs []struct {
		ID, Status string
		Result     json.RawMessage
	}
	if err := json.Unmarshal([]byte(strings.TrimPrefix(r.stdout, "planned|")), &outs); err != nil {
		t.Fatalf("DROVER_CHILDREN_FILE: %v: %q", err, r.stdout)
	}
	want := []string{`fan-1.1.a SUCCEEDED {"sq":4}`, `fan-1.1.b SUCCEEDED {"sq":9}`, `fan-1.1.c SUCCEEDED {"sq":16}`}
	for i, o := range outs {
		if i >= len(want) || o.ID+" "+o.Status+" "+string(o.Result) != want[i] {
			t.Fatalf("outcomes %+v; want %v", outs, want)
		}
	}
	if len(outs) != len(want) {
		t.Fatalf("outcomes %+v; want %v", outs, want)
	}
	b, _ := os.ReadFile(log)
	if got := strings.Fields(string(b)); strings.Join(got, " ") != "plan merge" {
		t.Fatalf("steps ran %v; want plan then merge, once each", got)
	}
	if len(runs) != 4 { // the seed and the three children: the second run spawned nothing
		t.Fatalf("tasks run: %v", runs)
	}
	for _, id := range []string{"fan-1.1.a", "fan-1.1.b", "fan-1.1.c"} {
		if runs[id] != 1 {
			t.Fatalf("child %s ran %d times; runs %v", id, runs[id], runs)
		}
	}

	// Without collect, a dead child fails the run, naming it.
	dead := `printf x; echo '{"children": [{"queue": "sq", "task_type": "sq", "parameters": {"i": -1}, "key": "neg", "max_retries": 0}]}' > "$DROVER_SPAWN_FILE"`
	args := append(etcdFlags(ns), "task", "run", "fan-2", "--step", "a="+dead, "--step", "b=cat")
	if r = drover(t, args...); r.code != 75 {
		t.Fatalf("spawn of a child that fails: %d %q %q", r.code, r.stdout, r.stderr)
	}
	work()
	if r = drover(t, args...); r.code == 0 || r.code == 75 || !strings.Contains(r.stderr, "fan-2.1.neg") {
		t.Fatalf("run after a dead child: %d %q %q", r.code, r.stdout, r.stderr)
	}

	// A queue that does not exist: the step fails, naming the file and the field; nothing is checkpointed.
	bad := drover(t, append(etcdFlags(ns), "task", "run", "fan-3", "--step", `a=echo '{"children": [{"queue": "nowhere", "task_type": "x"}]}' > "$DROVER_SPAWN_FILE"`, "--step", "b=true")...)
	if bad.code == 0 || bad.code == 75 || !strings.Contains(bad.stderr, "DROVER_SPAWN_FILE children[0].queue") {
		t.Fatalf("an unknown queue: %d %q %q", bad.code, bad.stdout, bad.stderr)
	}
	if h := drover(t, append(etcdFlags(ns), "task", "history", "fan-3")...); h.code != 0 || !strings.Contains(h.stdout, "no checkpoint yet") {
		t.Fatalf("history after a refused spawn: %s", h.stdout)
	}
	// Two endings at once: refused, naming the files.
	two := drover(t, append(etcdFlags(ns), "task", "run", "fan-4", "--step", `a=echo 1h > "$DROVER_SLEEP_FILE"; echo '{"children": []}' > "$DROVER_SPAWN_FILE"`, "--step", "b=true")...)
	if two.code == 0 || two.code == 75 || !strings.Contains(two.stderr, "DROVER_SPAWN_FILE") {
		t.Fatalf("a sleep and a spawn: %d %q %q", two.code, two.stdout, two.stderr)
	}
}
