// Package demo plays a crash-and-resume scenario end to end with real processes: three
// worker processes race for one four-step agent task, the winner is killed
// with SIGKILL during step 3, and another worker takes over and resumes at
// step 3, not step 1. It checks every invariant of the run from etcd's
// records and the workers' events, and reports a timeline and a summary.
package demo

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/task"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// StepNames are the steps of the demo's agent task.
var StepNames = []string{"Data Ingestion", "LLM Analysis", "Report Generation", "Finalization"}

// Defaults of Config.
const (
	DefaultWorkers      = 3
	DefaultStepDuration = time.Second
	DefaultTTL          = 3 * time.Second
	DefaultKillStep     = 3
	DefaultTimeout      = 28 * time.Second
	// Namespace and TaskID name the demo's keys in its private etcd.
	Namespace = "demo"
	TaskID    = "weekly-report"
)

// Config says how to play the demo. The zero value plays the standard one.
type Config struct {
	// Executable is the drover binary whose "demo-worker" command runs
	// each worker; "" means this process's own executable.
	Executable   string
	Workers      int
	StepDuration time.Duration
	TTL          time.Duration
	// KillStep is the step during which the holder is killed.
	KillStep int
	// Timeout bounds the whole run.
	Timeout time.Duration
	// Timeline receives one line per event; nil discards them.
	Timeline io.Writer
}

func (c *Config) defaults() {
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.StepDuration == 0 {
		c.StepDuration = DefaultStepDuration
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.KillStep == 0 {
		c.KillStep = DefaultKillStep
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultTimeout
	}
	if c.Timeline == nil {
		c.Timeline = io.Discard
	}
}

// Summary is the outcome of a demo run; it is what `drover demo --json`
// prints.
type Summary struct {
	TaskID                  string   `json:"task_id"`
	Workers                 []string `json:"workers"`
	TTLMillis               int64    `json:"ttl_ms"`
	FirstHolder             string   `json:"first_holder"`
	CrashedWorker           string   `json:"crashed_worker"`
	CrashedDuringStep       int      `json:"crashed_during_step"`
	ResumedBy               string   `json:"resumed_by"`
	ResumedFromStep         int      `json:"resumed_from_step"`
	StepsCompleted          int      `json:"steps_completed"`
	CheckpointedStepsRedone int      `json:"checkpointed_steps_redone"`
	StepsRunTwice           []int    `json:"steps_run_twice"`
	TakeoverMillis          int64    `json:"takeover_ms"`
	FinalStatus             string   `json:"final_status"`
	DurationMillis          int64    `json:"duration_ms"`
	InvariantsMet           bool     `json:"invariants_met"`
	Violations              []string `json:"violations"`
}

// ErrInvariant is returned (with the summary) when the run broke an
// invariant.
var ErrInvariant = errors.New("demo: invariant violated")

type workerProc struct {
	id  string
	cmd *exec.Cmd
}

// Run plays the demo: a private embedded etcd in a temporary directory, the
// worker processes, the kill, the takeover. Everything it starts is stopped
// and removed before it returns.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	cfg.defaults()
	sum := Summary{TaskID: TaskID, TTLMillis: cfg.TTL.Milliseconds(), Violations: []string{}, StepsRunTwice: []int{}}
	exe := cfg.Executable
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return sum, fmt.Errorf("demo: find the drover binary: %w", err)
		}
	}
	start := time.Now()
	line := func(who, format string, args ...any) {
		fmt.Fprintf(cfg.Timeline, "  +%6.3fs  %-9s %s\n", time.Since(start).Seconds(), who, fmt.Sprintf(format, args...))
	}

	dir, err := os.MkdirTemp("", "drover-demo-")
	if err != nil {
		return sum, fmt.Errorf("demo: %w", err)
	}
	defer os.RemoveAll(dir)
	clientAddr, err := cluster.FreeLoopbackAddr()
	if err != nil {
		return sum, err
	}
	peerAddr, err := cluster.FreeLoopbackAddr()
	if err != nil {
		return sum, err
	}
	srv, err := cluster.Embed(ctx, cluster.EmbedConfig{DataDir: dir, ClientURL: "http://" + clientAddr, PeerURL: "http://" + peerAddr})
	if err != nil {
		return sum, fmt.Errorf("demo: %w", err)
	}
	defer func() { _ = srv.Close(context.WithoutCancel(ctx)) }()
	line("etcd", "embedded etcd ready at %s (data in a temporary directory)", clientAddr)
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		return sum, err
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	events := make(chan task.Event, 256)
	var readers sync.WaitGroup
	procs := map[string]*workerProc{}
	defer func() {
		for _, p := range procs {
			_ = p.cmd.Process.Kill()
		}
		readers.Wait()
		for _, p := range procs {
			_ = p.cmd.Wait()
		}
	}()
	for i := 1; i <= cfg.Workers; i++ {
		id := fmt.Sprintf("worker-%d", i)
		cmd := exec.Command(exe, "demo-worker",
			"--etcd-endpoints", clientAddr, "--namespace", Namespace, "--log-level", "error",
			"--task", TaskID, "--worker-id", id, "--ttl", cfg.TTL.String(), "--step-duration", cfg.StepDuration.String())
		cmd.Env = append(os.Environ(), "ETCD_ENDPOINTS=")
		// A worker dies with the demo, however the demo ends.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return sum, fmt.Errorf("demo: %w", err)
		}
		if err := cmd.Start(); err != nil {
			return sum, fmt.Errorf("demo: start %s: %w", id, err)
		}
		procs[id] = &workerProc{id: id, cmd: cmd}
		sum.Workers = append(sum.Workers, id)
		line(id, "started (pid %d)", cmd.Process.Pid)
		readers.Add(1)
		go func() {
			defer readers.Done()
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				var ev task.Event
				if json.Unmarshal(sc.Bytes(), &ev) != nil {
					continue
				}
				select {
				case events <- ev:
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	go func() { readers.Wait(); close(events) }()

	var (
		killTimer  <-chan time.Time
		killedAt   time.Time
		starts     = map[int][]string{}  // step -> workers that started it
		checkpoint = map[int]time.Time{} // step -> when it was checkpointed
		redone     = 0
	)
loop:
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				break loop // every worker has ended
			}
			switch ev.Type {
			case task.EventWaiting:
				line(ev.Worker, "waits: the task is held by another worker (watching its lock key)")
			case task.EventAcquired:
				if sum.FirstHolder == "" {
					sum.FirstHolder = ev.Worker
					line(ev.Worker, "acquired the task lock (fencing token %d)", ev.Token)
				} else if !killedAt.IsZero() && sum.ResumedBy == "" {
					sum.ResumedBy = ev.Worker
					line(ev.Worker, "acquired the task lock (fencing token %d), %d ms after the crash: the lease expired and etcd deleted the lock key", ev.Token, time.Since(killedAt).Milliseconds())
				} else {
					line(ev.Worker, "acquired the task lock (fencing token %d)", ev.Token)
				}
			case task.EventResumed:
				if ev.Step == 1 {
					line(ev.Worker, "starts at step 1 (%s): no checkpoint yet", ev.Name)
				} else {
					line(ev.Worker, "resumes at step %d (%s): %s", ev.Step, ev.Name, task.CheckpointedUpTo(ev.Step-1))
				}
				if ev.Worker == sum.ResumedBy {
					sum.ResumedFromStep = ev.Step
				}
			case task.EventStepStarted:
				starts[ev.Step] = append(starts[ev.Step], ev.Worker)
				if _, done := checkpoint[ev.Step]; done {
					redone++
				}
				if ev.Worker == sum.ResumedBy && sum.TakeoverMillis == 0 {
					sum.TakeoverMillis = time.Since(killedAt).Milliseconds()
				}
				line(ev.Worker, "step %d %s: started", ev.Step, ev.Name)
				if ev.Step == cfg.KillStep && killedAt.IsZero() && killTimer == nil {
					sum.CrashedWorker, sum.CrashedDuringStep = ev.Worker, ev.Step
					killTimer = time.After(cfg.StepDuration * 2 / 5)
				}
			case task.EventStepCheckpointed:
				checkpoint[ev.Step] = ev.At
				line(ev.Worker, "step %d %s: checkpointed (fenced by token %d)", ev.Step, ev.Name, ev.Token)
			case task.EventCompleted:
				sum.FinalStatus = "completed"
				line(ev.Worker, "task completed; lock released")
			case task.EventAlreadyCompleted:
				line(ev.Worker, "task already completed; nothing to do")
			case task.EventLost:
				line(ev.Worker, "lost the task: %s", ev.Err)
			}
		case <-killTimer:
			killTimer = nil
			p := procs[sum.CrashedWorker]
			killedAt = time.Now()
			_ = p.cmd.Process.Signal(syscall.SIGKILL)
			line("demo", "SIGKILL %s (pid %d) during step %d (%s); its lease stops being renewed",
				p.id, p.cmd.Process.Pid, cfg.KillStep, StepNames[cfg.KillStep-1])
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				sum.Violations = append(sum.Violations, fmt.Sprintf("the run did not finish within %s", cfg.Timeout))
			} else {
				sum.Violations = append(sum.Violations, "interrupted")
			}
			for _, p := range procs {
				_ = p.cmd.Process.Kill()
			}
			break loop
		}
	}
	for _, p := range procs {
		_ = p.cmd.Wait()
	}
	sum.DurationMillis = time.Since(start).Milliseconds()

	// Check the run against etcd's records.
	store, err := task.NewStore(cli, Namespace)
	if err != nil {
		return sum, err
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	cp, err := store.Load(rctx, TaskID)
	if err != nil {
		return sum, err
	}
	hist, err := store.History(rctx, TaskID)
	if err != nil {
		return sum, err
	}
	sum.StepsCompleted = len(hist)
	sum.CheckpointedStepsRedone = redone
	for s := 1; s <= len(StepNames); s++ {
		if len(starts[s]) > 1 {
			sum.StepsRunTwice = append(sum.StepsRunTwice, s)
		}
	}
	if sum.FinalStatus == "" {
		sum.FinalStatus = "incomplete"
	}
	sum.Violations = append(sum.Violations, check(cfg, sum, cp, hist, starts, killedAt)...)
	sum.InvariantsMet = len(sum.Violations) == 0
	if !sum.InvariantsMet {
		return sum, fmt.Errorf("%w: %s", ErrInvariant, strings.Join(sum.Violations, "; "))
	}
	return sum, nil
}

// check returns every invariant the run broke.
func check(cfg Config, sum Summary, cp task.Checkpoint, hist []task.StepRecord, starts map[int][]string, killedAt time.Time) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	if killedAt.IsZero() {
		add("no worker was killed during step %d", cfg.KillStep)
	}
	if !cp.Completed || cp.Step != len(StepNames) {
		add("the task's checkpoint is at step %d, completed=%t; want step %d, completed", cp.Step, cp.Completed, len(StepNames))
	}
	if len(hist) != len(StepNames) {
		add("%d step records, want %d", len(hist), len(StepNames))
	}
	for i, rec := range hist {
		want := sum.CrashedWorker
		if rec.Step >= cfg.KillStep {
			want = sum.ResumedBy
		}
		if rec.Step != i+1 || rec.Name != StepNames[i] || rec.Worker != want {
			add("step record %d is %+v; want step %d (%s) by %s", i, rec, i+1, StepNames[i], want)
		}
	}
	if sum.ResumedBy == "" || sum.ResumedBy == sum.CrashedWorker {
		add("no other worker took over")
	}
	if sum.ResumedFromStep != cfg.KillStep {
		add("resumed from step %d, want %d", sum.ResumedFromStep, cfg.KillStep)
	}
	if sum.CheckpointedStepsRedone != 0 {
		add("%d checkpointed steps were run again", sum.CheckpointedStepsRedone)
	}
	for s, ws := range starts {
		if len(ws) > 1 && s != cfg.KillStep {
			add("step %d ran %d times (%v); only the step in flight at the crash may run twice", s, len(ws), ws)
		}
	}
	if limit := cfg.TTL + time.Second; sum.TakeoverMillis > limit.Milliseconds() {
		add("takeover took %d ms, over TTL + 1 s (%d ms)", sum.TakeoverMillis, limit.Milliseconds())
	}
	if sum.FinalStatus != "completed" {
		add("final status %q", sum.FinalStatus)
	}
	return v
}

// Steps returns the demo's agent steps for worker: each "calls a model" for
// d (a deterministic stand-in that stops the moment ctx is cancelled) and
// adds its result to the state.
func Steps(worker string, d time.Duration) []task.Step {
	steps := make([]task.Step, len(StepNames))
	for i, name := range StepNames {
		steps[i] = task.Step{Name: name, Run: func(ctx context.Context, state []byte) ([]byte, error) {
			var st struct {
				Results []string `json:"results"`
			}
			if len(state) > 0 {
				if err := json.Unmarshal(state, &st); err != nil {
					return nil, fmt.Errorf("read state: %w", err)
				}
			}
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			case <-t.C:
			}
			st.Results = append(st.Results, fmt.Sprintf("%s done by %s", name, worker))
			return json.Marshal(st)
		}}
	}
	return steps
}

// Worker runs one demo worker: it races for the task and runs it, printing
// every event as a JSON line to out.
func Worker(ctx context.Context, cli *clientv3.Client, ns, taskID, worker string, ttl, step time.Duration, out io.Writer) error {
	var mu sync.Mutex
	enc := json.NewEncoder(out)
	r, err := task.NewRunner(ctx, cli, task.RunnerConfig{Namespace: ns, WorkerID: worker, TTL: ttl, OnEvent: func(ev task.Event) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(ev)
	}})
	if err != nil {
		return err
	}
	defer r.Close(context.WithoutCancel(ctx))
	_, err = r.Run(ctx, taskID, Steps(worker, step))
	return err
}
