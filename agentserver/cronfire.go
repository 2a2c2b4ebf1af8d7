package agentserver

import (
	"context"
	"crypto/sha1"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// fireID is the UUID (v5 form) of what a cron's fire makes, from the
// fire's task id, which its schedule derives from the cron and the tick:
// a fire retried after a crash makes the same run on the same thread.
func fireID(kind, taskID string) string {
	h := sha1.New()
	h.Write([]byte("drover agent-server cron fire\x00" + kind + "\x00" + taskID))
	var b [16]byte
	copy(b[:], h.Sum(nil))
	b[6] = 0x50 | b[6]&0x0f
	b[8] = 0x80 | b[8]&0x3f
	return format(b)
}

// fireOutcome is a fire task's result: what the fire did.
type fireOutcome struct {
	Outcome  string `json:"outcome" doc:"created, exists (made by an earlier attempt), skipped (why says), or gone (the cron is)."`
	RunID    string `json:"run_id,omitempty"`
	ThreadID string `json:"thread_id,omitempty"`
	Why      string `json:"why,omitempty"`
}

// fireCron makes the run of the fire of cron id that task taskID is: on
// the cron's thread, or on a new thread for a cron without one. The run's
// and the thread's ids derive from taskID, so a fire attempted again
// finds its run made (the one transaction that creates it compares its
// absence) and makes none, but submits its task if the attempt that made
// it died before that. A thread whose active run refuses
// the run (multitask strategy reject, LangGraph's default) skips the
// tick, as LangGraph does; an error means try again.
func (s *server) fireCron(ctx context.Context, id, taskID string) (fireOutcome, error) {
	c, _, err := s.getCron(ctx, id)
	if isNotFound(err) { // deleted (its schedule is deleted after it), or truncated: no schedule outlives its cron
		return fireOutcome{Outcome: "gone"}, s.dropSchedule(ctx, id)
	}
	if err != nil {
		return fireOutcome{}, err
	}
	now := s.now()
	if !c.Enabled {
		return fireOutcome{Outcome: "skipped", Why: "the cron is disabled"}, nil
	}
	if c.EndTime != nil && now.After(*c.EndTime) {
		_, err := s.updateCron(ctx, id, cronPatch{Enabled: new(bool)})
		return fireOutcome{Outcome: "skipped", Why: "past the cron's end_time: it is disabled"}, err
	}
	a, _, err := s.getAssistant(ctx, c.AssistantID)
	if isNotFound(err) { // the assistant was deleted: so is its cron
		return fireOutcome{Outcome: "gone", Why: "its assistant is gone"}, s.dropCron(ctx, id)
	}
	if err != nil {
		return fireOutcome{}, err
	}
	thread, temporary := derefOr(c.ThreadID), c.ThreadID == nil
	runID := fireID("run", taskID)
	if temporary {
		thread = fireID("thread", taskID)
		t := Thread{ThreadID: thread, CreatedAt: now, UpdatedAt: now, Status: "idle", Config: map[string]any{}, Interrupts: map[string]any{},
			Metadata: map[string]any{"graph_id": a.GraphID, "assistant_id": a.AssistantID, "cron_id": c.CronID}}
		if _, err := s.createThread(ctx, t, true); err != nil {
			return fireOutcome{}, err
		}
	}
	out := fireOutcome{RunID: runID, ThreadID: thread}
	_, err = s.createRun(ctx, fireRun(c, a, runID, thread, now), a, temporary, 0)
	var se huma.StatusError
	var exists errRunExists
	switch {
	case err == nil:
		out.Outcome = "created"
		return out, nil
	case errors.As(err, &exists): // made by an earlier attempt, which may have died before its task
		out.Outcome = "exists"
		return out, s.ensureFireTask(ctx, thread, runID)
	case isNotFound(err): // the thread was deleted: so is its cron
		return fireOutcome{Outcome: "gone", Why: "its thread is gone"}, s.dropCron(ctx, id)
	case errors.As(err, &se) && se.GetStatus() == http.StatusConflict:
		out.Outcome, out.Why = "skipped", err.Error()
		return out, nil
	}
	return fireOutcome{}, err
}

// ensureFireTask submits the task of the fire's run id when the attempt
// that made the run died before submitting it.
func (s *server) ensureFireTask(ctx context.Context, thread, id string) error {
	r, _, err := s.getRun(ctx, thread, id)
	if isNotFound(err) {
		return nil // taken back, or the thread deleted: the fire made nothing to run
	}
	if err != nil {
		return err
	}
	return s.ensureTask(ctx, r)
}

// fireRun is the run record of a fire of cron c, as a run created with
// the cron's payload would be.
func fireRun(c Cron, a assistantRecord, runID, thread string, now time.Time) runRecord {
	p := c.Payload
	strategy, _ := p["multitask_strategy"].(string)
	if strategy == "" {
		strategy = "reject"
	}
	cfg, _ := p["config"].(map[string]any)
	subgraphs, _ := p["stream_subgraphs"].(bool)
	resumable, _ := p["stream_resumable"].(bool)
	durability, _ := p["durability"].(string)
	checkpointID, _ := p["checkpoint_id"].(string)
	kwargs := map[string]any{"input": p["input"], "command": nil, "config": orEmpty(cfg), "context": p["context"],
		"stream_mode": streamModes(p["stream_mode"]), "interrupt_before": p["interrupt_before"], "interrupt_after": p["interrupt_after"],
		"checkpoint": nil, "checkpoint_id": checkpointID, "subgraphs": subgraphs, "resumable": resumable,
		"temporary": c.ThreadID == nil && c.OnRunCompleted != "keep", "durability": durability}
	md := map[string]any{}
	if m, ok := p["metadata"].(map[string]any); ok {
		for k, v := range m {
			md[k] = v
		}
	}
	md["cron_id"] = c.CronID
	return runRecord{Run: Run{RunID: runID, ThreadID: thread, AssistantID: a.AssistantID, CreatedAt: now, UpdatedAt: now,
		Status: "pending", Metadata: md, Kwargs: kwargs, MultitaskStrategy: strategy}, GraphID: a.GraphID}
}

// dropSchedule deletes the schedule of cron id, which is gone.
func (s *server) dropSchedule(ctx context.Context, id string) error {
	sc, done, err := s.schedules(ctx)
	if err != nil {
		return err
	}
	defer done()
	if err := sc.Delete(ctx, cronScheduleName(id)); err != nil && !errors.Is(err, schedule.ErrNotFound) {
		return err
	}
	return nil
}

// dropCron deletes cron id whose assistant or thread is gone.
func (s *server) dropCron(ctx context.Context, id string) error {
	if err := s.deleteCron(ctx, id); err != nil && !isNotFound(err) {
		return err
	}
	return nil
}

// CronRunner makes the runs of crons' fires: in every namespace that has
// schedules, it claims the tasks of queue CronsQueue that the schedules'
// runner submits, one per tick, and makes each fire's run. Every drover
// server runs one beside its schedule runner; any number may run at once,
// a task is claimed by one, and a fire claimed again (its claimer died)
// finds the run it made. Start and Stop make its one lifecycle.
type CronRunner struct {
	Etcd *clientv3.Client
	// Logger gets the fires that failed (nil: slog.Default()).
	Logger *slog.Logger
	// Now is the clock of the runs' times (nil: time.Now).
	Now func() time.Time
	// Poll is how often it looks for namespaces that got schedules (0: 2s).
	Poll time.Duration
	// Sweep is how often it makes the schedules of every namespace's
	// crons as their records say (0: a minute): see sweepCrons.
	Sweep time.Duration

	// newWorker makes a namespace's worker (nil: queue.NewWorker).
	newWorker func(context.Context, *clientv3.Client, queue.WorkerConfig) (*queue.Worker, error)

	mu     sync.Mutex
	cancel context.CancelFunc
	wg     sync.WaitGroup
	// running holds the namespaces whose worker runs; a worker that
	// stopped (its lease lost) leaves it, and the next poll starts another.
	running map[string]bool
}

// Start starts the runner until Stop or ctx's end; once.
func (r *CronRunner) Start(ctx context.Context) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel != nil {
		return
	}
	ctx, r.cancel = context.WithCancel(ctx)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.run(ctx)
	}()
}

// Stop stops claiming, lets the fires under way end, and returns then.
func (r *CronRunner) Stop() {
	r.mu.Lock()
	cancel := r.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	r.wg.Wait()
}

func (r *CronRunner) logger() *slog.Logger {
	if r.Logger != nil {
		return r.Logger
	}
	return slog.Default()
}

// run starts a worker per namespace with schedules, as they appear, until
// ctx ends.
func (r *CronRunner) run(ctx context.Context) {
	poll := r.Poll
	if poll <= 0 {
		poll = 2 * time.Second
	}
	sweep := r.Sweep
	if sweep <= 0 {
		sweep = time.Minute
	}
	prefix := keyspace.ScheduleNamespaces()
	t := time.NewTicker(poll)
	defer t.Stop()
	var swept time.Time
	for {
		g, err := r.Etcd.Get(ctx, prefix, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err == nil {
			for _, kv := range g.Kvs {
				if ns := string(kv.Key[len(prefix):]); !r.isRunning(ns) && ctx.Err() == nil {
					r.startWorker(ctx, ns)
				}
			}
			if time.Since(swept) >= sweep {
				swept = time.Now()
				for _, kv := range g.Kvs {
					r.sweep(ctx, string(kv.Key[len(prefix):]))
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// sweep makes the schedules of namespace ns's crons as their records
// say, logging a failure: the next sweep tries again.
func (r *CronRunner) sweep(ctx context.Context, ns string) {
	s := &server{cfg: Config{Etcd: r.Etcd, Namespace: func(context.Context) string { return ns }, Now: r.Now}}
	if s.cfg.Now == nil {
		s.cfg.Now = time.Now
	}
	if err := s.sweepCrons(ctx); err != nil && ctx.Err() == nil {
		r.logger().Warn("agent-server crons: the sweep of the crons' schedules failed; the next tries again", "namespace", ns, "err", err)
	}
}

// isRunning reports whether namespace ns's worker runs.
func (r *CronRunner) isRunning(ns string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[ns]
}

// setRunning records whether namespace ns's worker runs.
func (r *CronRunner) setRunning(ns string, on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.running == nil {
		r.running = map[string]bool{}
	}
	if on {
		r.running[ns] = true
	} else {
		delete(r.running, ns)
	}
}

// startWorker runs a worker of namespace ns's CronsQueue until ctx ends
// or it stops; a worker it cannot make is tried again at the next poll.
func (r *CronRunner) startWorker(ctx context.Context, ns string) {
	now := r.Now
	if now == nil {
		now = time.Now
	}
	s := &server{cfg: Config{Etcd: r.Etcd, Namespace: func(context.Context) string { return ns }, Now: now}}
	newWorker := r.newWorker
	if newWorker == nil {
		newWorker = queue.NewWorker
	}
	w, err := newWorker(ctx, r.Etcd, queue.WorkerConfig{Namespace: ns, Queue: CronsQueue, Concurrency: 4, Logger: r.logger()})
	if err != nil {
		r.logger().Error("agent-server crons: no worker for the namespace", "namespace", ns, "err", err)
		return
	}
	w.Handle(CronTaskType, func(ctx context.Context, t *queue.Task) ([]byte, error) {
		var p struct {
			CronID string `json:"cron_id"`
		}
		if err := json.Unmarshal(t.Parameters, &p); err != nil || p.CronID == "" {
			return nil, fmt.Errorf("%w: the fire names no cron", queue.ErrPermanent)
		}
		out, err := s.fireCron(ctx, p.CronID, t.ID)
		if err != nil {
			r.logger().Warn("agent-server cron fire failed; it is tried again", "namespace", ns, "cron", p.CronID, "task", t.ID, "err", err)
			return nil, err
		}
		return json.Marshal(out)
	})
	r.setRunning(ns, true)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer r.setRunning(ns, false)
		if err := w.Run(ctx); err != nil && ctx.Err() == nil {
			r.logger().Error("agent-server crons: the worker stopped", "namespace", ns, "err", err)
		}
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_ = w.Close(cctx) // its lease, which held its claims
	}()
}
