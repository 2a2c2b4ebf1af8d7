// Package demo plays a crash-and-resume scenario end to end with real processes: three
// worker processes race for one four-step agent task, the winner is killed
// with SIGKILL during step 3, and another worker takes over and resumes at
// step 3, not step 1. It checks every invariant of the run from etcd's
// records and the workers' events, and reports a timeline and a summary.
package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
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

// Run plays the demo: a private embedded etcd in a temporary directory, the
// worker processes, the kill, the takeover. Everything it starts is stopped
// and removed before it returns.
func Run(ctx context.Context, cfg Config) (Summary, error) {
	cfg.defaults()
	p := newPlay(cfg)
	exe, err := executable(cfg.Executable)
	if err != nil {
		return p.sum, err
	}
	p.start = time.Now()
	dir, err := os.MkdirTemp("", "drover-demo-")
	if err != nil {
		return p.sum, fmt.Errorf("demo: %w", err)
	}
	defer os.RemoveAll(dir)
	srv, clientAddr, err := p.startEtcd(ctx, dir)
	if err != nil {
		return p.sum, err
	}
	defer func() { _ = srv.Close(context.WithoutCancel(ctx)) }()
	cli, err := cluster.Connect(ctx, cluster.ClientConfig{Endpoints: srv.Endpoints()})
	if err != nil {
		return p.sum, err
	}
	defer cli.Close()

	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	defer p.stopWorkers()
	if err := p.startWorkers(ctx, exe, clientAddr); err != nil {
		return p.sum, err
	}
	p.follow(ctx)
	p.sum.DurationMillis = time.Since(p.start).Milliseconds()
	return p.verify(ctx, cli)
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
