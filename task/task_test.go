package task_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/testenv/etcdtest"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func newRunner(t *testing.T, ns, worker string, ttl time.Duration, onEvent func(task.Event)) *task.Runner {
	t.Helper()
	r, err := task.NewRunner(context.Background(), srv.Client(t), task.RunnerConfig{Namespace: ns, WorkerID: worker, TTL: ttl, OnEvent: onEvent})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r
}

// starts reads the step log: how many times each "task step" started, and
// by which workers.
func starts(t *testing.T, path string) map[string][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) != 3 {
			t.Fatalf("step log line %q", line)
		}
		out[f[0]+" "+f[1]] = append(out[f[0]+" "+f[1]], f[2])
	}
	return out
}

func TestThreeWorkersTwentyTasks(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	logPath := filepath.Join(t.TempDir(), "steps.log")
	var ids []string
	for i := 0; i < 20; i++ {
		ids = append(ids, fmt.Sprintf("task-%02d", i))
	}
	var workers []*worker
	for w := 0; w < 3; w++ {
		// Each worker walks the tasks from a different place, so they race.
		order := append(append([]string{}, ids[w*7:]...), ids[:w*7]...)
		workers = append(workers, startWorker(t, "run", "H_NS="+ns, "H_TTL=5s", "H_STEP=15ms", "H_STEPS=4",
			"H_LOG="+logPath, fmt.Sprintf("H_ID=worker-%d", w), "H_TASKS="+strings.Join(order, ",")))
	}
	for _, w := range workers {
		if err := w.cmd.Wait(); err != nil {
			t.Fatalf("worker: %v", err)
		}
	}
	store, _ := task.NewStore(srv.Client(t), ns)
	started := starts(t, logPath)
	ran := map[string]int{}
	for _, id := range ids {
		cp, err := store.Load(context.Background(), id)
		if err != nil || !cp.Completed || cp.Step != 4 || string(cp.State) != "|s1|s2|s3|s4" {
			t.Fatalf("%s checkpoint = %+v (%v)", id, cp, err)
		}
		hist, err := store.History(context.Background(), id)
		if err != nil || len(hist) != 4 {
			t.Fatalf("%s history = %+v (%v)", id, hist, err)
		}
		for i, rec := range hist {
			key := fmt.Sprintf("%s s%d", id, i+1)
			if rec.Step != i+1 || rec.Name != fmt.Sprintf("s%d", i+1) {
				t.Fatalf("%s record %d = %+v", id, i, rec)
			}
			if len(started[key]) != 1 {
				t.Fatalf("%s started %d times (by %v), want once", key, len(started[key]), started[key])
			}
			if started[key][0] != rec.Worker {
				t.Fatalf("%s ran on %s but its record names %s", key, started[key][0], rec.Worker)
			}
			ran[rec.Worker]++
		}
	}
	t.Logf("steps run per worker: %v", ran)
}

func TestWorkerKilledMidStep(t *testing.T) {
	ns := etcdtest.Namespace(t)
	const ttl = 2 * time.Second
	logPath := filepath.Join(t.TempDir(), "steps.log")
	w := startWorker(t, "run", "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=1s", "H_STEPS=4", "H_LOG="+logPath, "H_ID=victim", "H_TASKS=report")
	w.await(t, 20*time.Second, `"type":"step_started"`, `"step":2`)
	time.Sleep(300 * time.Millisecond) // mid-step
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var resumedAfter time.Duration
	r := newRunner(t, ns, "rescuer", 5*time.Second, func(ev task.Event) {
		if ev.Type == task.EventStepStarted && resumedAfter == 0 {
			resumedAfter = time.Since(killed)
		}
	})
	steps := agentSteps(4, 10*time.Millisecond, logPath, "rescuer", false)
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), taskIDKey{}, "report"), 20*time.Second)
	defer cancel()
	res, err := r.Run(ctx, "report", steps)
	if err != nil {
		t.Fatal(err)
	}
	if res.ResumedFrom != 2 || res.StepsRun != 3 || string(res.State) != "|s1|s2|s3|s4" {
		t.Fatalf("result = %+v, want a resume at step 2", res)
	}
	if resumedAfter > ttl+time.Second {
		t.Fatalf("resumed %s after SIGKILL, want within TTL + 1s", resumedAfter)
	}
	t.Logf("resumed %s after SIGKILL (TTL %s)", resumedAfter.Round(time.Millisecond), ttl)
	got := starts(t, logPath)
	want := map[string][]string{
		"report s1": {"victim"}, "report s2": {"victim", "rescuer"}, // only the step in flight runs twice
		"report s3": {"rescuer"}, "report s4": {"rescuer"},
	}
	for k, v := range want {
		if strings.Join(got[k], ",") != strings.Join(v, ",") {
			t.Fatalf("%s started by %v, want %v", k, got[k], v)
		}
	}
	hist, _ := r.Store().History(context.Background(), "report")
	if len(hist) != 4 || hist[0].Worker != "victim" || hist[1].Worker != "rescuer" || hist[1].Token <= hist[0].Token {
		t.Fatalf("history = %+v", hist)
	}
}

func TestWorkerPausedPastTTL(t *testing.T) {
	ns := etcdtest.Namespace(t)
	const ttl = 2 * time.Second
	// The paused worker's steps take 2.5s and ignore their context, like a
	// blocking LLM call; each reports whether its context was cancelled.
	w := startWorker(t, "report", "H_NS="+ns, "H_TTL="+ttl.String(), "H_STEP=2500ms", "H_STEPS=3", "H_ID=sleeper", "H_TASKS=report")
	w.await(t, 20*time.Second, `"type":"step_started"`, `"step":1`)
	time.Sleep(200 * time.Millisecond)
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	r := newRunner(t, ns, "successor", 5*time.Second, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	res, err := r.Run(ctx, "report", agentSteps(3, 10*time.Millisecond, "", "successor", false))
	if err != nil {
		_ = w.cmd.Process.Signal(syscall.SIGCONT)
		t.Fatal(err)
	}
	if res.ResumedFrom != 1 || string(res.State) != "|s1|s2|s3" {
		t.Fatalf("successor result = %+v", res)
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if line := w.await(t, 20*time.Second, "STEPCTX s1"); !strings.Contains(line, "cancelled=true") {
		t.Fatalf("the paused worker's step context was not cancelled: %s", line)
	}
	if line := w.await(t, 20*time.Second, "RESULT report"); !strings.Contains(line, "fenced=true") {
		t.Fatalf("the paused worker's checkpoint was not refused: %s", line)
	}
	store, _ := task.NewStore(srv.Client(t), ns)
	cp, _ := store.Load(context.Background(), "report")
	hist, _ := store.History(context.Background(), "report")
	if !cp.Completed || string(cp.State) != "|s1|s2|s3" || cp.Worker != "successor" || len(hist) != 3 {
		t.Fatalf("the successor's progress was disturbed: %+v %+v", cp, hist)
	}
	for _, rec := range hist {
		if rec.Worker != "successor" || rec.Token != res.Token {
			t.Fatalf("step record %+v not written by the successor with token %d", rec, res.Token)
		}
	}
}

func TestStateTooLarge(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	ok := func(ctx context.Context, s []byte) ([]byte, error) { return append(s, "|ok"...), nil }
	huge := func(ctx context.Context, s []byte) ([]byte, error) {
		return make([]byte, task.DefaultStateLimit+1), nil
	}
	_, err := r.Run(context.Background(), "big", []task.Step{{Name: "a", Run: ok}, {Name: "b", Run: huge}, {Name: "c", Run: ok}})
	var tl *task.StateTooLargeError
	if !errors.As(err, &tl) || tl.Step != 2 || tl.Name != "b" || tl.Limit != task.DefaultStateLimit || !strings.Contains(err.Error(), "object store") {
		t.Fatalf("err = %v, want a StateTooLargeError for step 2 that says where large state goes", err)
	}
	cp, err := r.Store().Load(context.Background(), "big")
	if err != nil || cp.Step != 1 || string(cp.State) != "|ok" || cp.Completed {
		t.Fatalf("previous checkpoint disturbed: %+v (%v)", cp, err)
	}
	res, err := r.Run(context.Background(), "big", []task.Step{{Name: "a", Run: ok}, {Name: "b", Run: ok}, {Name: "c", Run: ok}})
	if err != nil || res.ResumedFrom != 2 || string(res.State) != "|ok|ok|ok" {
		t.Fatalf("rerun: %+v, %v", res, err)
	}
}

// A state just under the largest limit a runner accepts still fits in one
// etcd request once encoded.
func TestStateAtMaxLimitFits(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	r, err := task.NewRunner(context.Background(), srv.Client(t), task.RunnerConfig{Namespace: ns, TTL: 5 * time.Second, StateLimit: task.MaxStateLimit})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	big := func(ctx context.Context, s []byte) ([]byte, error) { return make([]byte, task.MaxStateLimit), nil }
	if _, err := r.Run(context.Background(), "max", []task.Step{{Name: "big", Run: big}}); err != nil {
		t.Fatalf("a state of exactly MaxStateLimit bytes: %v", err)
	}
}

func TestCompletedTaskNeverRunsAgain(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	calls := 0
	step := func(ctx context.Context, s []byte) ([]byte, error) { calls++; return s, nil }
	steps := []task.Step{{Name: "a", Run: step}, {Name: "b", Run: step}}
	if _, err := r.Run(context.Background(), "once", steps); err != nil {
		t.Fatal(err)
	}
	res, err := r.Run(context.Background(), "once", steps)
	if err != nil || !res.AlreadyCompleted || calls != 2 {
		t.Fatalf("second run: %+v, %v, %d step calls in all", res, err, calls)
	}
}

func TestStepErrorStopsAndResumes(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	boom := errors.New("model overloaded")
	fail := true
	steps := []task.Step{
		{Name: "a", Run: func(ctx context.Context, s []byte) ([]byte, error) { return []byte("A"), nil }},
		{Name: "b", Run: func(ctx context.Context, s []byte) ([]byte, error) {
			if fail {
				return nil, boom
			}
			return append(s, 'B'), nil
		}},
	}
	_, err := r.Run(context.Background(), "flaky", steps)
	var se *task.StepError
	if !errors.As(err, &se) || se.Step != 2 || !errors.Is(err, boom) || !errors.Is(err, task.ErrStepFailed) {
		t.Fatalf("err = %v, want StepError at step 2 wrapping the step's error", err)
	}
	fail = false
	res, err := r.Run(context.Background(), "flaky", steps)
	if err != nil || res.ResumedFrom != 2 || string(res.State) != "AB" {
		t.Fatalf("rerun: %+v, %v", res, err)
	}
	// A different number of steps than the checkpoint was written with is refused.
	if _, err := r.Run(context.Background(), "flaky", steps[:1]); err != nil {
		t.Fatalf("a completed task with other steps: %v", err)
	}
	_, _ = r.Run(context.Background(), "half", []task.Step{steps[0], {Name: "x", Run: func(ctx context.Context, s []byte) ([]byte, error) { return nil, boom }}})
	if _, err := r.Run(context.Background(), "half", append(steps, task.Step{Name: "c", Run: steps[0].Run})); !errors.Is(err, task.ErrStepsChanged) {
		t.Fatalf("changed steps: %v, want ErrStepsChanged", err)
	}
}

func TestStepContextCancelledOnLockLoss(t *testing.T) {
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	cli := srv.Client(t)
	inStep := make(chan struct{})
	var cause error
	steps := []task.Step{{Name: "llm", Run: func(ctx context.Context, s []byte) ([]byte, error) {
		close(inStep)
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
			return nil, ctx.Err()
		case <-time.After(10 * time.Second):
			return nil, errors.New("step context never cancelled")
		}
	}}}
	revoked := make(chan struct{})
	go func() {
		defer close(revoked)
		<-inStep
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, _ = cli.Revoke(ctx, r.Lease().ID())
	}()
	_, err := r.Run(context.Background(), "lost", steps)
	<-revoked
	if !errors.Is(err, lock.ErrLost) || !errors.Is(cause, lock.ErrLost) {
		t.Fatalf("run err %v, step cause %v; want both to match lock.ErrLost", err, cause)
	}
	cp, _ := r.Store().Load(context.Background(), "lost")
	if cp.Step != 0 {
		t.Fatalf("a checkpoint was written after the loss: %+v", cp)
	}
}

func TestWaitingWorkerTakesOverWithoutPolling(t *testing.T) {
	ns := etcdtest.Namespace(t)
	a := newRunner(t, ns, "a", 5*time.Second, nil)
	var events []task.Event
	b := newRunner(t, ns, "b", 5*time.Second, func(ev task.Event) { events = append(events, ev) })
	release := make(chan struct{})
	aIn := make(chan struct{})
	stepsA := []task.Step{{Name: "one", Run: func(ctx context.Context, s []byte) ([]byte, error) {
		close(aIn)
		<-release
		return []byte("a"), nil
	}}, {Name: "two", Run: func(ctx context.Context, s []byte) ([]byte, error) { return nil, errors.New("a stops here") }}}
	done := make(chan error, 1)
	var aReturned time.Time
	go func() { _, err := a.Run(context.Background(), "shared", stepsA); aReturned = time.Now(); done <- err }()
	<-aIn
	resB := make(chan task.Result, 1)
	go func() {
		res, err := b.Run(context.Background(), "shared", []task.Step{stepsA[0], {Name: "two", Run: func(ctx context.Context, s []byte) ([]byte, error) { return append(s, 'b'), nil }}})
		if err != nil {
			t.Error(err)
		}
		resB <- res
	}()
	time.Sleep(100 * time.Millisecond)
	close(release)
	if err := <-done; !errors.Is(err, task.ErrStepFailed) {
		t.Fatalf("a: %v", err)
	}
	res := <-resB
	if res.ResumedFrom != 2 || string(res.State) != "ab" || len(events) < 2 || events[0].Type != task.EventWaiting || events[1].Type != task.EventAcquired {
		t.Fatalf("b: %+v, events %+v", res, events)
	}
	// Woken by the release itself: without it b would take the task only
	// when a's 5 s lease ends (the runner never polls). The bound is well
	// under that and far over what a loaded machine adds to a watch event.
	if wake := events[1].At.Sub(aReturned); wake > 2*time.Second {
		t.Fatalf("b took the task %s after a released it", wake)
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	cli := srv.Client(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	step := func(ctx context.Context, s []byte) ([]byte, error) { return s, nil }
	for _, tc := range []struct {
		name  string
		id    string
		steps []task.Step
		field string
	}{
		{"empty id", "", []task.Step{{Name: "a", Run: step}}, "task id"},
		{"slash in id", "a/b", []task.Step{{Name: "a", Run: step}}, "task id"},
		{"long id", strings.Repeat("x", task.MaxIDLen+1), []task.Step{{Name: "a", Run: step}}, "task id"},
		{"no steps", "t", nil, "steps"},
		{"unnamed step", "t", []task.Step{{Run: step}}, "steps[0].name"},
		{"duplicate step", "t", []task.Step{{Name: "a", Run: step}, {Name: "a", Run: step}}, "steps[1].name"},
		{"no function", "t", []task.Step{{Name: "a"}}, "steps[0].run"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Run(context.Background(), tc.id, tc.steps)
			var ie *drover.InputError
			if !errors.As(err, &ie) || ie.Field != tc.field {
				t.Fatalf("err = %v, want an InputError for %s", err, tc.field)
			}
		})
	}
	for _, cfg := range []task.RunnerConfig{{Namespace: ns, TTL: 100 * time.Millisecond}, {Namespace: ns, StateLimit: task.MaxStateLimit + 1}, {Namespace: ns, WorkerID: "a b"}} {
		if _, err := task.NewRunner(context.Background(), cli, cfg); !errors.Is(err, drover.ErrInvalidInput) {
			t.Fatalf("config %+v: %v", cfg, err)
		}
	}
	g, err := cli.Get(context.Background(), keyspace.MustNew(ns).Tasks(), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || g.Count != 0 {
		t.Fatalf("bad input wrote %d task keys (%v)", g.Count, err)
	}
}

func TestHistoryJSON(t *testing.T) {
	t.Parallel()
	ns := etcdtest.Namespace(t)
	r := newRunner(t, ns, "w", 5*time.Second, nil)
	if _, err := r.Run(context.Background(), "h", agentSteps(2, 0, "", "w", false)); err != nil {
		t.Fatal(err)
	}
	hist, err := r.Store().History(context.Background(), "h")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(hist[0])
	for _, field := range []string{`"step":1`, `"name":"s1"`, `"worker":"w"`, `"token":`, `"started_at":`, `"finished_at":`} {
		if !strings.Contains(string(b), field) {
			t.Fatalf("step record JSON %s lacks %s", b, field)
		}
	}
}
