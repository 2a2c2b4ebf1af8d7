package demo

import (
	"context"
	"errors"
	"fmt"
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

type workerProc struct {
	id  string
	cmd *exec.Cmd
}

// play is one run of the demo: its workers, the events they report, and
// what those events showed so far.
type play struct {
	cfg   Config
	sum   Summary
	start time.Time

	procs   map[string]*workerProc
	events  chan task.Event
	readers sync.WaitGroup

	killTimer  <-chan time.Time
	killedAt   time.Time
	starts     map[int][]string  // step -> workers that started it
	checkpoint map[int]time.Time // step -> when it was checkpointed
	redone     int
}

func newPlay(cfg Config) *play {
	return &play{
		cfg:        cfg,
		sum:        Summary{TaskID: TaskID, TTLMillis: cfg.TTL.Milliseconds(), Violations: []string{}, StepsRunTwice: []int{}},
		procs:      map[string]*workerProc{},
		events:     make(chan task.Event, 256),
		starts:     map[int][]string{},
		checkpoint: map[int]time.Time{},
	}
}

// line writes one line of the timeline.
func (p *play) line(who, format string, args ...any) {
	fmt.Fprintf(p.cfg.Timeline, "  +%6.3fs  %-9s %s\n", time.Since(p.start).Seconds(), who, fmt.Sprintf(format, args...))
}

// executable is the drover binary whose "demo-worker" command runs the
// workers.
func executable(exe string) (string, error) {
	if exe != "" {
		return exe, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("demo: find the drover binary: %w", err)
	}
	return exe, nil
}

// startEtcd starts the demo's private embedded etcd with its data in dir,
// and returns it with its client address.
func (p *play) startEtcd(ctx context.Context, dir string) (*cluster.Server, string, error) {
	srv, clientAddr, err := embedEtcd(ctx, dir)
	if err != nil {
		return nil, "", err
	}
	p.line("etcd", "embedded etcd ready at %s (data in a temporary directory)", clientAddr)
	return srv, clientAddr, nil
}

// embedEtcd starts an embedded etcd with its data in dir, on free
// loopback ports, and returns it with its client address.
func embedEtcd(ctx context.Context, dir string) (*cluster.Server, string, error) {
	clientAddr, err := cluster.FreeLoopbackAddr()
	if err != nil {
		return nil, "", err
	}
	peerAddr, err := cluster.FreeLoopbackAddr()
	if err != nil {
		return nil, "", err
	}
	srv, err := cluster.Embed(ctx, cluster.EmbedConfig{DataDir: dir, ClientURL: "http://" + clientAddr, PeerURL: "http://" + peerAddr})
	if err != nil {
		return nil, "", fmt.Errorf("demo: %w", err)
	}
	return srv, clientAddr, nil
}

// startWorkers starts the worker processes against the etcd at clientAddr;
// their events arrive on p.events, which is closed once every worker's
// output has ended.
func (p *play) startWorkers(ctx context.Context, exe, clientAddr string) error {
	for i := 1; i <= p.cfg.Workers; i++ {
		if err := p.startWorker(ctx, exe, clientAddr, fmt.Sprintf("worker-%d", i)); err != nil {
			return err
		}
	}
	go func() { p.readers.Wait(); close(p.events) }()
	return nil
}

// startWorker starts worker id and a reader of its events.
func (p *play) startWorker(ctx context.Context, exe, clientAddr, id string) error {
	cmd := exec.Command(exe, "demo-worker",
		"--etcd-endpoints", clientAddr, "--namespace", Namespace, "--log-level", "error",
		"--task", TaskID, "--worker-id", id, "--ttl", p.cfg.TTL.String(), "--step-duration", p.cfg.StepDuration.String())
	if err := startEventer(ctx, cmd, id, p.events, &p.readers, nil); err != nil {
		return err
	}
	p.procs[id] = &workerProc{id: id, cmd: cmd}
	p.sum.Workers = append(p.sum.Workers, id)
	p.line(id, "started (pid %d)", cmd.Process.Pid)
	return nil
}

// stopWorkers kills every worker still running and waits for it and its
// reader.
func (p *play) stopWorkers() {
	for _, w := range p.procs {
		_ = w.cmd.Process.Kill()
	}
	p.readers.Wait()
	for _, w := range p.procs {
		_ = w.cmd.Wait()
	}
}

// follow reads the workers' events until every worker has ended or ctx
// ends, killing the holder during the kill step, and waits for the
// workers to exit.
func (p *play) follow(ctx context.Context) {
loop:
	for {
		select {
		case ev, ok := <-p.events:
			if !ok {
				break loop // every worker has ended
			}
			p.record(ev)
		case <-p.killTimer:
			p.killHolder()
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				p.sum.Violations = append(p.sum.Violations, fmt.Sprintf("the run did not finish within %s", p.cfg.Timeout))
			} else {
				p.sum.Violations = append(p.sum.Violations, "interrupted")
			}
			for _, w := range p.procs {
				_ = w.cmd.Process.Kill()
			}
			break loop
		}
	}
	for _, w := range p.procs {
		_ = w.cmd.Wait()
	}
}

// record notes one event of a worker on the timeline and in the summary;
// the start of the kill step arms the kill.
func (p *play) record(ev task.Event) {
	switch ev.Type {
	case task.EventWaiting:
		p.line(ev.Worker, "waits: the task is held by another worker (watching its lock key)")
	case task.EventAcquired:
		if p.sum.FirstHolder == "" {
			p.sum.FirstHolder = ev.Worker
			p.line(ev.Worker, "acquired the task lock (fencing token %d)", ev.Token)
		} else if !p.killedAt.IsZero() && p.sum.ResumedBy == "" {
			p.sum.ResumedBy = ev.Worker
			p.line(ev.Worker, "acquired the task lock (fencing token %d), %d ms after the crash: the lease expired and etcd deleted the lock key", ev.Token, time.Since(p.killedAt).Milliseconds())
		} else {
			p.line(ev.Worker, "acquired the task lock (fencing token %d)", ev.Token)
		}
	case task.EventResumed:
		if ev.Step == 1 {
			p.line(ev.Worker, "starts at step 1 (%s): no checkpoint yet", ev.Name)
		} else {
			p.line(ev.Worker, "resumes at step %d (%s): %s", ev.Step, ev.Name, task.CheckpointedUpTo(ev.Step-1))
		}
		if ev.Worker == p.sum.ResumedBy {
			p.sum.ResumedFromStep = ev.Step
		}
	case task.EventStepStarted:
		p.stepStarted(ev)
	case task.EventStepCheckpointed:
		p.checkpoint[ev.Step] = ev.At
		p.line(ev.Worker, "step %d %s: checkpointed (fenced by token %d)", ev.Step, ev.Name, ev.Token)
	case task.EventCompleted:
		p.sum.FinalStatus = "completed"
		p.line(ev.Worker, "task completed; lock released")
	case task.EventAlreadyCompleted:
		p.line(ev.Worker, "task already completed; nothing to do")
	case task.EventLost:
		p.line(ev.Worker, "lost the task: %s", ev.Err)
	}
}

// stepStarted records a step's start; the first start of the kill step
// arms the kill of its worker.
func (p *play) stepStarted(ev task.Event) {
	p.starts[ev.Step] = append(p.starts[ev.Step], ev.Worker)
	if _, done := p.checkpoint[ev.Step]; done {
		p.redone++
	}
	if ev.Worker == p.sum.ResumedBy && p.sum.TakeoverMillis == 0 {
		p.sum.TakeoverMillis = time.Since(p.killedAt).Milliseconds()
	}
	p.line(ev.Worker, "step %d %s: started", ev.Step, ev.Name)
	if ev.Step == p.cfg.KillStep && p.killedAt.IsZero() && p.killTimer == nil {
		p.sum.CrashedWorker, p.sum.CrashedDuringStep = ev.Worker, ev.Step
		p.killTimer = time.After(p.cfg.StepDuration * 2 / 5)
	}
}

// killHolder kills the worker that holds the task during the kill step.
func (p *play) killHolder() {
	p.killTimer = nil
	w := p.procs[p.sum.CrashedWorker]
	p.killedAt = time.Now()
	_ = w.cmd.Process.Signal(syscall.SIGKILL)
	p.line("demo", "SIGKILL %s (pid %d) during step %d (%s); its lease stops being renewed",
		w.id, w.cmd.Process.Pid, p.cfg.KillStep, StepNames[p.cfg.KillStep-1])
}

// verify checks the run against etcd's records and completes the summary.
func (p *play) verify(ctx context.Context, cli *clientv3.Client) (Summary, error) {
	store, err := task.NewStore(cli, Namespace)
	if err != nil {
		return p.sum, err
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer rcancel()
	cp, err := store.Load(rctx, TaskID)
	if err != nil {
		return p.sum, err
	}
	hist, err := store.History(rctx, TaskID)
	if err != nil {
		return p.sum, err
	}
	sum := &p.sum
	sum.StepsCompleted = len(hist)
	sum.CheckpointedStepsRedone = p.redone
	for s := 1; s <= len(StepNames); s++ {
		if len(p.starts[s]) > 1 {
			sum.StepsRunTwice = append(sum.StepsRunTwice, s)
		}
	}
	if sum.FinalStatus == "" {
		sum.FinalStatus = "incomplete"
	}
	sum.Violations = append(sum.Violations, check(p.cfg, *sum, cp, hist, p.starts, p.killedAt)...)
	sum.InvariantsMet = len(sum.Violations) == 0
	if !sum.InvariantsMet {
		return *sum, fmt.Errorf("%w: %s", ErrInvariant, strings.Join(sum.Violations, "; "))
	}
	return *sum, nil
}
