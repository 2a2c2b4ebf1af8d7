package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	"github.com/spf13/cobra"
)

// Environment passed to each step of drover task run.
const (
	EnvTaskID   = "DROVER_TASK_ID"
	EnvStep     = "DROVER_STEP"
	EnvStepName = "DROVER_STEP_NAME"
)

func (a *app) taskCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "task",
		Short: "Run step-wise agent tasks that resume after a crash; show their history",
		Example: `  drover task run report-42 --step 'ingest=./ingest.sh' --step 'analyze=python3 analyze.py'
  drover task history report-42`,
	}
	cmd.AddCommand(a.taskRunCommand(), a.taskHistoryCommand())
	return cmd
}

// parseSteps turns --step NAME=CMD values into steps run by sh -c.
func parseSteps(specs []string) ([]string, []string, error) {
	var names, cmds []string
	for i, s := range specs {
		name, cmd, ok := strings.Cut(s, "=")
		name, cmd = strings.TrimSpace(name), strings.TrimSpace(cmd)
		if !ok || name == "" || cmd == "" {
			return nil, nil, &drover.InputError{Field: fmt.Sprintf("--step #%d", i+1), Value: s, Rule: "must be NAME=COMMAND"}
		}
		names, cmds = append(names, name), append(cmds, cmd)
	}
	// The same rules the runner applies, before anything is contacted.
	steps := make([]task.Step, len(names))
	for i, n := range names {
		steps[i] = task.Step{Name: n, Run: func(context.Context, []byte) ([]byte, error) { return nil, nil }}
	}
	if len(steps) > 0 {
		if err := task.CheckSteps(steps); err != nil {
			var ie *drover.InputError
			if errors.As(err, &ie) {
				var i int
				if _, serr := fmt.Sscanf(ie.Field, "steps[%d]", &i); serr == nil {
					return nil, nil, ie.Renamed(fmt.Sprintf("--step #%d name", i+1))
				}
			}
			return nil, nil, err
		}
	}
	return names, cmds, nil
}

// taskRunLong is the help of drover task run.
const taskRunLong = `Run task TASK_ID made of shell-command steps, run in order with sh -c.

Each step gets the state the previous step printed on its standard input,
and prints the new state on its standard output (at most 1 MiB). Its
environment has DROVER_TASK_ID, DROVER_STEP (1-based), DROVER_STEP_NAME and
DROVER_LOCK_TOKEN (the fencing token). Exit 0 means done; anything else fails
the step and stops the run, leaving the last checkpoint as it was.

A step that writes a sleep to the file named by DROVER_SLEEP_FILE (10m, 90
in seconds, or an RFC 3339 time with its zone) and exits 0 ends with a
sleep: its output is checkpointed, the lock released, and drover exits 75
saying until when. Run the task again then (from any machine) and it
resumes at the next step; a run before then runs nothing and exits 75.

A step that writes a wait to the file named by DROVER_WAIT_FILE ("approval",
"approve,reject 24h": signal names, then a timeout as a duration or in
seconds; without one it waits without end) and exits 0 ends with a wait for
a signal: its output is checkpointed, the lock released, and drover exits
75 saying for what. Send the signal (drover signal TASK_ID NAME --data JSON)
and run the task again: the next step runs with the signal, its JSON
({"name", "data", "idempotency_key", "sent_at"}, or {"timed_out": true} once
the timeout passed) in the file DROVER_SIGNAL_FILE and its name in
DROVER_SIGNAL_NAME, and that step's checkpoint consumes it. A run before the
signal came runs nothing and exits 75.

A step that writes children to the file named by DROVER_SPAWN_FILE (JSON:
{"children": [{"queue", "task_type", "parameters", "key", "priority",
"max_retries", "timeout", "detached"}], "wait": N, "collect": BOOL}) and
exits 0 ends by spawning them into their queues: its output is checkpointed
with the children's plan, they are submitted once (ids TASK_ID.STEP.KEY),
the lock released, and drover exits 75 saying how many it waits for. Run
the task again once they ended (wait of them; 0: all): the next step runs
with their outcomes, a JSON array of {"id", "status", "result", "error"} in
id order, in the file DROVER_CHILDREN_FILE. Without "collect", a child that
ended DEAD or CANCELLED fails the run (exit 1), naming it. A step run again
after a crash spawns nothing twice.

Any number of workers may run the same task at once: one holds it, the others
wait on a watch and take over when its lease expires (--ttl), resuming after
the last checkpointed step. Each checkpoint is written fenced by the lock's
token, together with the step's record (see drover task history). If the lock
is lost while a step runs, the step's process group gets SIGTERM, then
SIGKILL after --grace, and drover exits 70. A completed task never runs again.

--lock-backend takes the task's lock (task:TASK_ID) from another backend, as
drover lock does: redis://HOST:PORT/DB, redlock://HOST:PORT,... or
paxos://HOST:PORT,... (drover paxos serve). Waiting workers then poll the
lock instead of watching it, and --ttl is the lock's TTL. Checkpoints stay
in etcd, each written in one etcd transaction fenced by the lock's token:
it commits only if no worker with a higher token has written for the task,
and a worker raises that mark to its own token as soon as it holds the lock.
Every worker of a task must use the same backend.

Progress goes to stderr; the final state to stdout (or a JSON result with
--json).`

func (a *app) taskRunCommand() *cobra.Command {
	var (
		specs    []string
		ttl      time.Duration
		grace    time.Duration
		workerID string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "run TASK_ID --step NAME=COMMAND [--step NAME=COMMAND ...]",
		Short: "Run a task's steps as commands, exactly one worker at a time, resuming after the last checkpoint",
		Long:  taskRunLong,
		Example: `  drover task run report-42 \
      --step 'ingest=curl -s https://example.test/data' \
      --step 'analyze=python3 analyze.py' \
      --step 'report=python3 report.py'
  drover task run report-42 --ttl 30s --step 'llm=./call-model.sh' --json
  drover task run report-42 --lock-backend paxos://10.0.0.1:7100,10.0.0.2:7100,10.0.0.3:7100 \
      --step 'ingest=./ingest.sh' --step 'analyze=python3 analyze.py'`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{errors.New("task run needs exactly one TASK_ID (see 'drover task run --help')")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if err := a.checkGlobal(); err != nil {
				return err
			}
			if err := task.CheckID(id); err != nil {
				return err
			}
			names, cmds, err := parseSteps(specs)
			if err != nil {
				return err
			}
			if len(names) == 0 {
				return &drover.InputError{Field: "--step", Rule: "give at least one, as NAME=COMMAND"}
			}
			if err := lease.CheckTTL("--ttl", ttl); err != nil {
				return err
			}
			if grace <= 0 {
				return &drover.InputError{Field: "--grace", Value: grace, Rule: "must be positive"}
			}
			if workerID != "" {
				if err := keyspace.CheckName("--worker-id", workerID); err != nil {
					return err
				}
			}
			return a.taskRun(cmd.Context(), id, names, cmds, ttl, grace, workerID, asJSON)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&specs, "step", nil, "a step as NAME=COMMAND; repeat in order")
	f.DurationVar(&ttl, "ttl", 15*time.Second, "lease (or lock) TTL: how soon another worker takes over if this one dies (1s to 24h)")
	f.DurationVar(&grace, "grace", 10*time.Second, "after the lock is lost, time between SIGTERM and SIGKILL for the step")
	f.StringVar(&workerID, "worker-id", "", "name recorded for this worker (default host:pid)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	f.StringVar(&a.lockBackend, "lock-backend", "etcd", "where the task's lock lives: etcd, redis://HOST:PORT/DB, redlock://HOST:PORT,HOST:PORT,HOST:PORT, or paxos://HOST:PORT,HOST:PORT,HOST:PORT (drover paxos serve); checkpoints stay in etcd")
	return cmd
}

// taskRunResult is the JSON form of a task run.
type taskRunResult struct {
	TaskID           string `json:"task_id"`
	Token            int64  `json:"token"`
	ResumedFrom      int    `json:"resumed_from_step"`
	StepsRun         int    `json:"steps_run"`
	AlreadyCompleted bool   `json:"already_completed"`
	State            string `json:"state"`
	// SleepingUntil is set when the task sleeps: run it again then.
	SleepingUntil *time.Time `json:"sleeping_until,omitempty"`
	// WaitingFor is set when the task waits for a signal: send it, then
	// run the task again.
	WaitingFor *task.Wait `json:"waiting_for,omitempty"`
}

func (a *app) taskRun(ctx context.Context, id string, names, cmds []string, ttl, grace time.Duration, workerID string, asJSON bool) error {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// A signal while no step runs ends the run; during a step it goes to
	// the step's process group, and the step decides.
	sr := &stepRunner{a: a, id: id, grace: grace, sigs: make(chan os.Signal, 4)}
	go func() {
		for {
			select {
			case sig := <-sigs:
				if !sr.inStep.Load() {
					cancel()
					continue
				}
				select {
				case sr.sigs <- sig:
				default:
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	r, closeRunner, err := a.taskRunner(ctx, ttl, workerID, func(ev task.Event) {
		if ev.Type == task.EventAcquired {
			sr.token = ev.Token
		}
		a.printTaskEvent(ev, len(names))
	})
	if err != nil {
		return err
	}
	defer closeRunner()
	steps := make([]task.Step, len(names))
	for i := range names {
		steps[i] = task.Step{Name: names[i], Run: sr.step(i+1, names[i], cmds[i])}
	}
	res, err := r.Run(ctx, id, steps)
	if err != nil {
		err = spawnError(err)
		if sr.lost || errors.Is(err, lock.ErrFenced) || errors.Is(err, lock.ErrLost) {
			return withCode(ExitLockLost, err)
		}
		if ctx.Err() != nil && errors.Is(err, context.Canceled) {
			return withCode(130, fmt.Errorf("task %s: interrupted; it resumes from its last checkpoint on the next run", id))
		}
		return err
	}
	out := taskRunResult{TaskID: id, Token: res.Token, ResumedFrom: res.ResumedFrom,
		StepsRun: res.StepsRun, AlreadyCompleted: res.AlreadyCompleted, State: string(res.State)}
	if !res.SleepingUntil.IsZero() {
		out.SleepingUntil = &res.SleepingUntil
	}
	out.WaitingFor = res.Waiting
	if asJSON {
		err = json.NewEncoder(a.stdout).Encode(out)
	} else if out.SleepingUntil == nil && out.WaitingFor == nil {
		_, err = a.stdout.Write(res.State)
	}
	switch {
	case err != nil:
	case out.SleepingUntil != nil:
		err = withCode(ExitBusy, fmt.Errorf("task %s sleeps until %s; nothing is held: run it again then", id, res.SleepingUntil.Format(time.RFC3339Nano)))
	case out.WaitingFor != nil && out.WaitingFor.Children != nil:
		err = withCode(ExitBusy, fmt.Errorf("task %s %s; nothing is held: run the task again once they ended", id, waitWords(out.WaitingFor)))
	case out.WaitingFor != nil:
		err = withCode(ExitBusy, fmt.Errorf("task %s %s; nothing is held: send it (drover signal %s NAME), then run the task again", id, waitWords(out.WaitingFor), id))
	}
	return err
}

// waitWords says what a task waits for.
func waitWords(w *task.Wait) string {
	if c := w.Children; c != nil {
		n := c.Wait
		if n == 0 {
			n = c.N
		}
		return fmt.Sprintf("waits for %d of the %d children of step %d", n, c.N, c.Step)
	}
	s := "waits for signal " + strings.Join(w.Signals, " or ")
	if !w.Until.IsZero() {
		s += " until " + w.Until.Format(time.RFC3339Nano)
	}
	return s
}

// taskRunner connects and makes the runner of drover task run: on its own
// etcd lease with --lock-backend etcd, else holding tasks through the
// locker that --lock-backend names (a.locker, as drover lock does), opened
// first so that a bad --lock-backend is refused before etcd is contacted.
// The returned function closes the runner, the etcd client, then the
// locker.
func (a *app) taskRunner(ctx context.Context, ttl time.Duration, workerID string, onEvent func(task.Event)) (*task.Runner, func(), error) {
	cfg := task.RunnerConfig{Namespace: a.namespace, WorkerID: workerID, TTL: ttl, Logger: a.logger, OnEvent: onEvent}
	closeLocker := func() {}
	if b := a.lockBackend; b != "" && b != "etcd" {
		locker, done, err := a.locker(ctx, ttl, workerID)
		if err != nil {
			return nil, nil, err
		}
		cfg.Locker, cfg.TTL, closeLocker = locker, 0, done
	}
	cli, err := a.connect(ctx)
	if err != nil {
		closeLocker()
		return nil, nil, err
	}
	// The queue client submits the children a step spawns (DROVER_SPAWN_FILE).
	qc, err := queue.NewClient(cli, a.namespace)
	if err != nil {
		cli.Close()
		closeLocker()
		return nil, nil, err
	}
	cfg.Spawner = qc.Spawner("")
	r, err := task.NewRunner(ctx, cli, cfg)
	if err != nil {
		_ = qc.Close(context.WithoutCancel(ctx))
		cli.Close()
		closeLocker()
		return nil, nil, err
	}
	return r, func() {
		cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer ccancel()
		_ = r.Close(cctx)
		_ = qc.Close(cctx)
		cli.Close()
		closeLocker()
	}, nil
}

// printTaskEvent writes one progress line for a task event to stderr.
func (a *app) printTaskEvent(ev task.Event, steps int) {
	var msg string
	switch ev.Type {
	case task.EventWaiting:
		msg = "held by another worker; waiting for it (watching its lock)"
		if b := a.lockBackend; b != "" && b != "etcd" {
			msg = "held by another worker; waiting for it (polling its lock)"
		}
	case task.EventAcquired:
		msg = fmt.Sprintf("acquired (fencing token %d)", ev.Token)
	case task.EventResumed:
		if ev.Step == 1 {
			msg = fmt.Sprintf("starting at step 1 of %d", steps)
		} else {
			msg = fmt.Sprintf("resuming at step %d of %d; %s", ev.Step, steps, task.CheckpointedUpTo(ev.Step-1))
		}
	case task.EventStepStarted:
		msg = fmt.Sprintf("step %d/%d %s: started", ev.Step, steps, ev.Name)
	case task.EventStepCheckpointed:
		msg = fmt.Sprintf("step %d/%d %s: checkpointed", ev.Step, steps, ev.Name)
	case task.EventCompleted:
		msg = "completed"
	case task.EventAlreadyCompleted:
		msg = "already completed; nothing to do"
	case task.EventSleeping:
		msg = fmt.Sprintf("step %d %s ended with a sleep until %s", ev.Step, ev.Name, ev.Until.Format(time.RFC3339Nano))
	case task.EventAwaitingSignal:
		msg = fmt.Sprintf("step %d %s ended with a wait: %s", ev.Step, ev.Name, waitWords(&task.Wait{Signals: ev.Signals, Until: ev.Until}))
	case task.EventSignalReceived:
		msg = fmt.Sprintf("step %d resumes with signal %s", ev.Step, ev.Name)
		if ev.Err != "" {
			msg = fmt.Sprintf("step %d resumes: the wait %s", ev.Step, ev.Err)
		}
	case task.EventLost:
		msg = "lost the task: " + ev.Err
	default:
		return
	}
	fmt.Fprintf(a.stderr, "drover: task %s: %s\n", ev.TaskID, msg)
}

// limitedBuffer keeps at most limit bytes and notes whether more came. It has
// no ReadFrom on purpose: io.Copy would use bytes.Buffer's, which reads
// everything into memory.
type limitedBuffer struct {
	buf      []byte
	limit, n int
	over     bool
}

func (b *limitedBuffer) Write(p []byte) (int, error) {
	b.n += len(p)
	if len(b.buf)+len(p) > b.limit {
		b.over = true
		return len(p), nil
	}
	b.buf = append(b.buf, p...)
	return len(p), nil
}

// Bytes returns what was kept.
func (b *limitedBuffer) Bytes() []byte { return b.buf }

var _ io.Writer = (*limitedBuffer)(nil)

func (a *app) taskHistoryCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "history TASK_ID",
		Short: "Show which worker ran which step of a task, under which token, and where takeovers happened",
		Example: `  drover task history report-42
  drover task history report-42 --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id := args[0]
			if err := a.checkGlobal(); err != nil {
				return err
			}
			if err := task.CheckID(id); err != nil {
				return err
			}
			cli, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer cli.Close()
			store, err := task.NewStore(cli, a.namespace)
			if err != nil {
				return err
			}
			cp, err := store.Load(cmd.Context(), id)
			if err != nil {
				return err
			}
			hist, err := store.History(cmd.Context(), id)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(struct {
					TaskID    string            `json:"task_id"`
					Step      int               `json:"step"`
					Steps     int               `json:"steps"`
					Completed bool              `json:"completed"`
					History   []task.StepRecord `json:"history"`
				}{id, cp.Step, cp.Steps, cp.Completed, append([]task.StepRecord{}, hist...)})
			}
			switch {
			case cp.Step == 0:
				fmt.Fprintf(a.stdout, "task %s: no checkpoint yet\n", id)
				return nil
			case cp.Completed:
				fmt.Fprintf(a.stdout, "task %s: completed, %d of %d steps\n", id, cp.Step, cp.Steps)
			case cp.Steps == 0: // its writers never said how many steps it has
				fmt.Fprintf(a.stdout, "task %s: at step %d, of a number of steps not recorded (%s checkpointed)\n", id, cp.Step, cp.StepName)
			default:
				fmt.Fprintf(a.stdout, "task %s: at step %d of %d (%s checkpointed)\n", id, cp.Step, cp.Steps, cp.StepName)
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "STEP\tNAME\tWORKER\tTOKEN\tSTARTED\tTOOK\t")
			for i, rec := range hist {
				note := ""
				if i > 0 && rec.Token != hist[i-1].Token {
					note = "<- taken over from " + hist[i-1].Worker
				}
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%s\t%s\n", rec.Step, rec.Name, rec.Worker, rec.Token,
					rec.StartedAt.Format(time.RFC3339), rec.FinishedAt.Sub(rec.StartedAt).Round(time.Millisecond), note)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}
