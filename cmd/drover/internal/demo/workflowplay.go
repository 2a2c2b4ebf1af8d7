package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// WorkflowNamespace names the workflow demo's keys in its private etcd.
const WorkflowNamespace = "demo-workflow"

// WorkflowConfig says how to play the workflow demo. The zero value plays
// the standard one.
type WorkflowConfig struct {
	// Executable is the drover binary whose "demo workflow-worker" and
	// "signal" commands run the worker and approver processes; "" means
	// this process's own executable.
	Executable string
	Children   int
	TTL        time.Duration
	Timeout    time.Duration
	// Timeline receives one line per event; nil discards them.
	Timeline io.Writer
}

func (c *WorkflowConfig) defaults() {
	if c.Children == 0 {
		c.Children = DefaultChildren
	}
	if c.TTL == 0 {
		c.TTL = DefaultWorkflowTTL
	}
	if c.Timeout == 0 {
		c.Timeout = DefaultWorkflowTimeout
	}
	if c.Timeline == nil {
		c.Timeline = io.Discard
	}
}

// WorkflowSummary is the outcome of a workflow demo run; it is what
// `drover demo workflow --json` prints.
type WorkflowSummary struct {
	TaskID  string   `json:"task_id"`
	Workers []string `json:"workers"`
	// Children is how many searches the agent spawned; ChildRuns how many
	// runs of them the workers reported, ChildrenRunOnce how many ran
	// exactly once, and ChildrenRunMore those that ran more often.
	Children         int            `json:"children"`
	ChildRuns        int            `json:"child_runs"`
	ChildrenRunOnce  int            `json:"children_run_once"`
	ChildrenRunMore  []string       `json:"children_run_more_than_once"`
	ChildrenByWorker map[string]int `json:"children_by_worker"`
	ChildrenStored   int64          `json:"children_succeeded_in_etcd"`
	// StepRuns counts the starts of each of the agent's steps.
	StepRuns    map[string]int `json:"step_runs"`
	StepRecords int            `json:"step_records"`
	SpawnedBy   string         `json:"spawned_by"`
	ParkedBy    string         `json:"parked_by"`
	// KilledWorker was SIGKILLed while the task waited for the approval;
	// StatusAfterKill is the task's status read right after it died,
	// RunningAfterKill the count of RUNNING tasks in the agent's queue
	// then, and HeldAfterKill the task's claim key and every key of it
	// bound to a lease then (none may be).
	KilledWorker     string   `json:"killed_worker"`
	KillConfirmed    bool     `json:"kill_confirmed"`
	StatusAfterKill  string   `json:"status_after_kill"`
	RunningAfterKill int64    `json:"running_after_kill"`
	HeldAfterKill    []string `json:"held_after_kill"`
	ApproverPID      int      `json:"approver_pid"`
	SignalWoke       bool     `json:"signal_woke"`
	// SignalRetryStored: the approver's retry with the same key stored a
	// second signal (it must not).
	SignalRetryStored bool `json:"signal_retry_stored"`
	// SignalRetry says what became of the retry: not stored (the key was
	// seen), or refused (the task had finished meanwhile).
	SignalRetry     string `json:"signal_retry"`
	SignalsConsumed int64  `json:"signals_consumed"`
	SignalsLeft     int64  `json:"signals_left"`
	// SignalSeenVersion is the version of the consumed signal's
	// tombstone: 1 when it was written once.
	SignalSeenVersion int64 `json:"signal_seen_version"`
	// ResumedBy ran the act step; ParentResumes counts the act step's
	// starts after the approval.
	ResumedBy     string `json:"resumed_by"`
	ParentResumes int    `json:"parent_resumes"`
	FanOutMillis  int64  `json:"fan_out_ms"`
	ResumeMillis  int64  `json:"signal_to_resume_ms"`
	FinalStatus   string `json:"final_status"`
	Findings      int    `json:"findings"`
	ApprovedBy    string `json:"approved_by"`
	Result        string `json:"result_summary"`

	DurationMillis int64    `json:"duration_ms"`
	InvariantsMet  bool     `json:"invariants_met"`
	Violations     []string `json:"violations"`
}

// wfPlay is one run of the workflow demo.
type wfPlay struct {
	cfg   WorkflowConfig
	sum   WorkflowSummary
	start time.Time
	exe   string
	addr  string
	qc    *queue.Client
	cli   *clientv3.Client

	procs   map[string]*wfProc
	events  chan WorkflowEvent
	readers sync.WaitGroup

	childRuns          map[string]int
	planAt, signalAt   time.Time
	killed, signalSent bool
}

func (p *wfPlay) line(who, format string, args ...any) {
	p.lineAt(time.Now(), who, format, args...)
}

// lineAt notes an event that happened at at (a worker's, stamped by it).
func (p *wfPlay) lineAt(at time.Time, who, format string, args ...any) {
	fmt.Fprintf(p.cfg.Timeline, "  +%6.3fs  %-9s %s\n", at.Sub(p.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// RunWorkflow plays the workflow demo: a private embedded etcd in a
// temporary directory, two worker processes, the research agent's fan-out
// of its searches, its wait for an approval, the SIGKILL of the worker that
// parked it, the approval sent by another process, and the resume on the
// other worker. Everything it starts is stopped and removed before it
// returns.
func RunWorkflow(ctx context.Context, cfg WorkflowConfig) (WorkflowSummary, error) {
	sum, err := runWorkflow(ctx, cfg)
	if err != nil && !errors.Is(err, ErrInvariant) {
		sum.Violations = append(sum.Violations, err.Error())
		sum.InvariantsMet = false
	}
	return sum, err
}

func runWorkflow(ctx context.Context, cfg WorkflowConfig) (WorkflowSummary, error) {
	cfg.defaults()
	p := &wfPlay{cfg: cfg, procs: map[string]*wfProc{}, events: make(chan WorkflowEvent, 1024), childRuns: map[string]int{},
		sum: WorkflowSummary{TaskID: WorkflowTaskID, Workers: []string{}, Children: cfg.Children, ChildrenRunMore: []string{},
			ChildrenByWorker: map[string]int{}, HeldAfterKill: []string{}, StepRuns: map[string]int{}, Violations: []string{}}}
	exe, err := executable(cfg.Executable)
	if err != nil {
		return p.sum, err
	}
	p.exe, p.start = exe, time.Now()
	dir, err := os.MkdirTemp("", "drover-demo-")
	if err != nil {
		return p.sum, fmt.Errorf("demo: %w", err)
	}
	defer os.RemoveAll(dir)
	srv, addr, err := embedEtcd(ctx, dir)
	if err != nil {
		return p.sum, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = srv.Close(cctx)
	}()
	p.addr = addr
	p.line("etcd", "embedded etcd ready at %s (data in a temporary directory)", addr)
	cli, err := connectEtcd(ctx, srv.Endpoints())
	if err != nil {
		return p.sum, err
	}
	defer cli.Close()
	p.cli = cli
	if p.qc, err = queue.NewClient(cli, WorkflowNamespace); err != nil {
		return p.sum, err
	}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	defer p.stopWorkers()
	if err := p.submit(ctx); err != nil {
		return p.sum, err
	}
	for i := 1; i <= DefaultWorkflowWorkers; i++ {
		if err := p.startWorker(ctx, fmt.Sprintf("worker-%d", i)); err != nil {
			return p.sum, err
		}
	}
	p.follow(ctx)
	p.stopWorkers()
	p.sum.DurationMillis = time.Since(p.start).Milliseconds()
	return p.verify(ctx, cli)
}

// submit creates the search queue and submits the research agent's task.
func (p *wfPlay) submit(ctx context.Context) error {
	if err := p.qc.SetConfig(ctx, SearchQueue, queue.Config{}); err != nil {
		return fmt.Errorf("demo: create queue %s: %w", SearchQueue, err)
	}
	if _, err := p.qc.Submit(ctx, ResearchQueue, []queue.Task{{ID: WorkflowTaskID, Type: "research"}}, nil); err != nil {
		return fmt.Errorf("demo: submit %s: %w", WorkflowTaskID, err)
	}
	p.line("demo", "submitted %s to queue %s: plan, fan out %d searches, merge, wait for approval, act", WorkflowTaskID, ResearchQueue, p.cfg.Children)
	return nil
}

// startWorker starts worker process id and a reader of its events.
func (p *wfPlay) startWorker(ctx context.Context, id string) error {
	cmd := exec.Command(p.exe, "demo", "workflow-worker",
		"--etcd-endpoints", p.addr, "--namespace", WorkflowNamespace, "--log-level", "error",
		"--worker-id", id, "--ttl", p.cfg.TTL.String(), "--children", fmt.Sprint(p.cfg.Children))
	w := &wfProc{id: id, cmd: cmd, eof: make(chan struct{})}
	if err := startEventer(ctx, cmd, id, p.events, &p.readers, w.eof); err != nil {
		return err
	}
	p.procs[id] = w
	p.sum.Workers = append(p.sum.Workers, id)
	p.line(id, "started (pid %d): works queues %s and %s", cmd.Process.Pid, ResearchQueue, SearchQueue)
	return nil
}

// wfProc is a worker process of the workflow demo; eof is closed once
// its reader read its stdout to the end (or gave up with the run).
type wfProc struct {
	id     string
	cmd    *exec.Cmd
	eof    chan struct{}
	waited bool
}

// reap records the workers' events until w's reader is done, then waits
// for w: Wait closes the pipe, so it must come after the last read.
func (p *wfPlay) reap(w *wfProc) {
	if w.waited {
		return
	}
	for done := false; !done; {
		select {
		case ev := <-p.events:
			p.record(ev)
		case <-w.eof:
			done = true
		}
	}
	_ = w.cmd.Wait()
	w.waited = true
}

// stopWorkers stops every worker still running (SIGTERM, then SIGKILL
// after 5 s) and waits for its reader, then for it.
func (p *wfPlay) stopWorkers() {
	for _, w := range p.procs {
		if !w.waited {
			_ = w.cmd.Process.Signal(syscall.SIGTERM)
		}
	}
	t := time.AfterFunc(5*time.Second, func() {
		for _, w := range p.procs {
			_ = w.cmd.Process.Kill() // an error once it was reaped
		}
	})
	defer t.Stop()
	for _, w := range p.procs {
		p.reap(w)
	}
	for {
		select {
		case ev := <-p.events:
			p.record(ev)
		default:
			return
		}
	}
}

// follow reads the workers' events and watches the task until it ended
// or ctx ends; once the task waits for the approval it kills the worker
// that parked it and sends the approval from another process.
func (p *wfPlay) follow(ctx context.Context) {
	tick := time.NewTicker(25 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case ev := <-p.events:
			p.record(ev)
		case <-tick.C:
			t, err := p.qc.Get(ctx, WorkflowTaskID)
			if err != nil {
				continue
			}
			if t.CurrentStatus.Terminal() {
				// The last step's report may still be on its way.
				p.awaitStep(ctx, "act", time.Second)
				p.sum.FinalStatus = string(t.CurrentStatus)
				p.line("demo", "%s %s: %s", WorkflowTaskID, t.CurrentStatus, resultSummary(t.Result))
				return
			}
			if !p.killed && p.sum.ParkedBy != "" && t.CurrentStatus == queue.Waiting && t.WaitingFor != nil &&
				slices.Contains(t.WaitingFor.Signals, ApprovalSignal) {
				p.killParker(ctx)
				p.approve(ctx)
			}
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				p.sum.Violations = append(p.sum.Violations, fmt.Sprintf("the run did not finish within %s", p.cfg.Timeout))
			} else {
				p.sum.Violations = append(p.sum.Violations, "interrupted")
			}
			return
		}
	}
}

// awaitStep records the workers' events until one reports step, for at
// most d.
func (p *wfPlay) awaitStep(ctx context.Context, step string, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	for p.sum.StepRuns[step] == 0 {
		select {
		case ev := <-p.events:
			p.record(ev)
		case <-t.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// resultSummary is the report's summary line, or the raw result.
func resultSummary(b []byte) string {
	var r Report
	if json.Unmarshal(b, &r) != nil || r.Summary == "" {
		return string(b)
	}
	return r.Summary
}

// record notes one event of a worker on the timeline and in the summary.
func (p *wfPlay) record(ev WorkflowEvent) {
	switch ev.Kind {
	case "ready":
		p.lineAt(time.UnixMilli(ev.At), ev.Worker, "ready")
	case "child":
		p.childRuns[ev.Task]++
		p.sum.ChildRuns++
		p.sum.ChildrenByWorker[ev.Worker]++
		if n := len(p.childRuns); p.childRuns[ev.Task] == 1 && (n%10 == 0 || n == p.cfg.Children) {
			p.lineAt(time.UnixMilli(ev.At), ev.Worker, "%d of %d searches started (%s)", n, p.cfg.Children, p.byWorker())
		}
	case "step":
		p.sum.StepRuns[ev.Step]++
		p.step(ev)
	}
}

// step notes the start of one of the agent's steps.
func (p *wfPlay) step(ev WorkflowEvent) {
	switch ev.Step {
	case "plan":
		p.sum.SpawnedBy, p.planAt = ev.Worker, time.UnixMilli(ev.At)
		p.lineAt(time.UnixMilli(ev.At), ev.Worker, "step 1 plan: spawns %d searches into queue %s and waits for all; the agent parks, holding nothing", p.cfg.Children, SearchQueue)
	case "merge":
		p.sum.ParkedBy = ev.Worker
		if !p.planAt.IsZero() {
			p.sum.FanOutMillis = ev.At - p.planAt.UnixMilli()
		}
		p.lineAt(time.UnixMilli(ev.At), ev.Worker, "step 2 merge: resumed once the last search ended (%d ms after the spawn); merged %d findings; waits for signal %q",
			p.sum.FanOutMillis, ev.Merged, ApprovalSignal)
	case "act":
		p.sum.ResumedBy = ev.Worker
		if p.killed && ev.Signal == ApprovalKey {
			p.sum.ParentResumes++
		}
		if !p.signalAt.IsZero() {
			p.sum.ResumeMillis = ev.At - p.signalAt.UnixMilli()
		}
		p.lineAt(time.UnixMilli(ev.At), ev.Worker, "step 3 act: resumes with the approval (key %s), %d ms after it was sent", ev.Signal, p.sum.ResumeMillis)
	}
}

func (p *wfPlay) byWorker() string {
	var s string
	for _, w := range p.sum.Workers {
		if s != "" {
			s += ", "
		}
		s += fmt.Sprintf("%s: %d", w, p.sum.ChildrenByWorker[w])
	}
	return s
}

// killParker SIGKILLs the worker that parked the task, while it waits,
// and reads what the task holds then: its status, the RUNNING count of
// its queue, its claim and any key of it bound to a lease.
func (p *wfPlay) killParker(ctx context.Context) {
	p.killed = true
	w := p.procs[p.sum.ParkedBy]
	p.sum.KilledWorker = w.id
	err := w.cmd.Process.Signal(syscall.SIGKILL)
	p.reap(w)
	ws, ok := w.cmd.ProcessState.Sys().(syscall.WaitStatus)
	p.sum.KillConfirmed = err == nil && ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
	if !p.sum.KillConfirmed {
		p.sum.Violations = append(p.sum.Violations, fmt.Sprintf("SIGKILL of %s did not end it (send: %v, it ended: %s)", w.id, err, w.cmd.ProcessState))
	}
	p.line("demo", "SIGKILL %s (pid %d) while %s waits for the approval", w.id, w.cmd.Process.Pid, WorkflowTaskID)
	t, err := p.qc.Get(ctx, WorkflowTaskID)
	if err != nil {
		p.sum.Violations = append(p.sum.Violations, fmt.Sprintf("read %s after the kill: %v", WorkflowTaskID, err))
		return
	}
	p.sum.StatusAfterKill = string(t.CurrentStatus)
	st, err := p.qc.Stats(ctx, ResearchQueue)
	if err != nil {
		p.sum.Violations = append(p.sum.Violations, fmt.Sprintf("count queue %s after the kill: %v", ResearchQueue, err))
		return
	}
	p.sum.RunningAfterKill = st.Running
	held, err := heldKeys(ctx, p.cli)
	if err != nil {
		p.sum.Violations = append(p.sum.Violations, err.Error())
		return
	}
	p.sum.HeldAfterKill = held
	verdict := "the dead worker held no claim, lease or slot of it"
	if st.Running != 0 || len(held) != 0 {
		verdict = fmt.Sprintf("something still holds it: %v", held)
	}
	p.line("demo", "%s is still %s, %d tasks RUNNING in %s, %d keys of it claimed or leased: %s",
		WorkflowTaskID, t.CurrentStatus, st.Running, ResearchQueue, len(held), verdict)
}

// heldKeys returns the task's claim key if there is one, and every key
// of the task bound to a lease.
func heldKeys(ctx context.Context, cli *clientv3.Client) ([]string, error) {
	keys := keyspace.MustNew(WorkflowNamespace)
	held := []string{}
	claim, err := cli.Get(ctx, keys.QueueClaim(ResearchQueue, WorkflowTaskID))
	if err != nil {
		return nil, fmt.Errorf("demo: read %s's claim: %w", WorkflowTaskID, err)
	}
	own, err := cli.Get(ctx, keys.Task(WorkflowTaskID), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return nil, fmt.Errorf("demo: read %s's keys: %w", WorkflowTaskID, err)
	}
	for _, kv := range append(claim.Kvs, own.Kvs...) {
		if kv.Lease != 0 || string(kv.Key) == keys.QueueClaim(ResearchQueue, WorkflowTaskID) {
			held = append(held, string(kv.Key))
		}
	}
	return held, nil
}

// approve sends the approval from another process, then sends it again
// with the same idempotency key, as a retry would.
func (p *wfPlay) approve(ctx context.Context) {
	data := `{"approved": true, "by": "ana"}`
	for i, who := range []string{"approver", "retry"} {
		cmd := exec.CommandContext(ctx, p.exe, "signal", WorkflowTaskID, ApprovalSignal, "--data", data,
			"--idempotency-key", ApprovalKey, "--json", "--etcd-endpoints", p.addr, "--namespace", WorkflowNamespace, "--log-level", "error")
		cmd.Env = append(os.Environ(), "ETCD_ENDPOINTS=")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if i == 0 {
			p.signalAt = time.Now()
		}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var res queue.SignalResult
		if err == nil {
			err = json.Unmarshal(out, &res)
		}
		if i == 1 && err != nil && strings.Contains(stderr.String(), "already finished") {
			// The agent finished before the retry came: refused, 409.
			p.sum.SignalRetry = "refused: the task had finished"
			p.line(who, "pid %d: the same signal sent again (same key): refused, the task had finished", cmd.Process.Pid)
			break
		}
		if err != nil {
			p.sum.Violations = append(p.sum.Violations, fmt.Sprintf("the %s process failed: %v: %s", who, err, strings.TrimSpace(stderr.String())))
			return
		}
		if i == 0 {
			p.sum.ApproverPID, p.sum.SignalWoke = cmd.Process.Pid, res.Woke
			p.line(who, "pid %d: drover signal %s %s --data '%s' --idempotency-key %s: stored %t, woke the task %t",
				cmd.Process.Pid, WorkflowTaskID, ApprovalSignal, data, ApprovalKey, res.Stored, res.Woke)
		} else {
			p.sum.SignalRetryStored = res.Stored
			p.sum.SignalRetry = "not stored: a duplicate of the key"
			p.line(who, "pid %d: the same signal sent again (same key): stored %t, nothing delivered twice", cmd.Process.Pid, res.Stored)
		}
	}
	p.signalSent = true
}
