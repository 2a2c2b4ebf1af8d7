package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cmd/drover/internal/demo"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/task"
	"github.com/spf13/cobra"
)

func (a *app) demoCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Watch 3 worker processes race for a 4-step agent task, lose the winner to SIGKILL, and resume",
		Long: `Play the failover scenario end to end on this machine, with nothing to set up:

  1. start an embedded etcd in a temporary directory;
  2. start 3 worker processes that race for one 4-step agent task
     (Data Ingestion, LLM Analysis, Report Generation, Finalization; about
     1 s each; lease TTL 3 s);
  3. kill the winner with SIGKILL during step 3;
  4. watch another worker take over when the dead worker's lease expires,
     and resume at step 3, not step 1.

It prints a timeline and a summary, checks every invariant against etcd's
records, exits 0 only if all held, and leaves no process or file behind.
With --json the timeline goes to stderr and one JSON object to stdout.`,
		Example: `  drover demo
  drover demo --json | jq .takeover_ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			timeline := a.stdout
			if asJSON {
				timeline = a.stderr
			}
			fmt.Fprintf(timeline, "drover demo: %d worker processes race for one %d-step agent task (lease TTL %s); the winner is killed during step %d\n",
				demo.DefaultWorkers, len(demo.StepNames), demo.DefaultTTL, demo.DefaultKillStep)
			// Ctrl-C or SIGTERM ends the run early; Run still stops the
			// workers and removes its directory.
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sum, err := demo.Run(ctx, demo.Config{Timeline: timeline})
			if asJSON {
				if jerr := json.NewEncoder(a.stdout).Encode(sum); jerr != nil {
					return jerr
				}
			} else if sum.FirstHolder != "" {
				printSummary(a.stdout, sum)
			}
			return demoExit(err)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as one JSON object on stdout (the timeline goes to stderr)")
	cmd.AddCommand(a.lostUpdateCommand(), a.demoWorkflowCommand(), a.demoWorkflowWorkerCommand())
	return cmd
}

func (a *app) demoWorkflowCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "workflow [--json]",
		Short: "Watch a research agent fan out 50 searches, wait for an approval, lose its worker to SIGKILL, and resume",
		Long: `Play a workflow end to end on this machine, with nothing to set up:

  1. start an embedded etcd in a temporary directory and 2 worker processes,
     each working the queues research (the agent) and search (its children);
  2. a research agent's first step spawns 50 searches into queue search and
     waits for all of them: it parks, holding no claim, slot or lease;
  3. once the last search ended, its next step merges the 50 findings and
     waits for the signal approval;
  4. the worker that parked it is killed with SIGKILL while it waits; the
     demo checks that the task is still WAITING, that queue research has no
     task RUNNING, and that no claim of the task and no key of it bound to a
     lease is left;
  5. another process sends the approval (drover signal), then sends it again
     with the same idempotency key, as a retry would;
  6. the other worker resumes the agent, which assembles its report.

It prints a timeline and a summary, checks every invariant (each search ran
once, the signal was consumed once, the agent resumed exactly once, the
report holds the 50 findings and the approval) against etcd's records and
the workers' reports, exits 0 only if all held, and leaves no process or file
behind. With --json the timeline goes to stderr and one JSON object to stdout.`,
		Example: `  drover demo workflow
  drover demo workflow --json | jq '{children_run_once, signals_consumed, parent_resumes, invariants_met}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			timeline := a.stdout
			if asJSON {
				timeline = a.stderr
			}
			fmt.Fprintf(timeline, "drover demo workflow: a research agent fans out %d searches, waits for an approval sent by another process, and loses its worker to SIGKILL while it waits\n",
				demo.DefaultChildren)
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sum, err := demo.RunWorkflow(ctx, demo.WorkflowConfig{Timeline: timeline})
			if asJSON {
				if jerr := json.NewEncoder(a.stdout).Encode(sum); jerr != nil {
					return jerr
				}
			} else if len(sum.Workers) > 0 {
				printWorkflowSummary(a.stdout, sum)
			}
			return demoExit(err)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as one JSON object on stdout (the timeline goes to stderr)")
	return cmd
}

// demoExit maps a demo's broken invariant to exit code 1 (ExitFailure);
// any other error keeps its own code.
func demoExit(err error) error {
	if errors.Is(err, demo.ErrInvariant) {
		return withCode(ExitFailure, err)
	}
	return err
}

func printWorkflowSummary(w io.Writer, s demo.WorkflowSummary) {
	fmt.Fprintf(w, "\nSummary\n")
	fmt.Fprintf(w, "  task %s: %s, %d findings, approved by %q: %s\n", s.TaskID, s.FinalStatus, s.Findings, s.ApprovedBy, s.Result)
	fmt.Fprintf(w, "  searches: %d spawned, %d ran once, %d more often (%d runs in all; %s)\n",
		s.Children, s.ChildrenRunOnce, len(s.ChildrenRunMore), s.ChildRuns, fmtCounts(s.ChildrenByWorker))
	fmt.Fprintf(w, "  fan-out to fan-in: %d ms; %s parked the agent and was killed while it waited (the task stayed %s)\n",
		s.FanOutMillis, s.KilledWorker, s.StatusAfterKill)
	fmt.Fprintf(w, "  approval: woke the task %t; its retry: %s; signals consumed %d, left %d\n",
		s.SignalWoke, s.SignalRetry, s.SignalsConsumed, s.SignalsLeft)
	fmt.Fprintf(w, "  %s resumed the agent %d time(s), %d ms after the approval; step runs %s, %d step records\n",
		s.ResumedBy, s.ParentResumes, s.ResumeMillis, fmtCounts(s.StepRuns), s.StepRecords)
	fmt.Fprintf(w, "  total %s\n", (time.Duration(s.DurationMillis) * time.Millisecond).String())
	if s.InvariantsMet {
		fmt.Fprintf(w, "  every invariant held\n")
	} else {
		fmt.Fprintf(w, "  INVARIANTS BROKEN:\n    %s\n", strings.Join(s.Violations, "\n    "))
	}
}

// fmtCounts prints counts by name in name order.
func fmtCounts(m map[string]int) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// demoWorkflowWorkerCommand is the worker process drover demo workflow
// starts.
func (a *app) demoWorkflowWorkerCommand() *cobra.Command {
	var (
		worker   string
		children int
		ttl      time.Duration
	)
	cmd := &cobra.Command{
		Use: "workflow-worker", Short: "One worker of drover demo workflow (started by it)", Hidden: true, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if children < 1 || children > 1000 {
				return &drover.InputError{Field: "--children", Value: children, Rule: "must be between 1 and 1000"}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM)
			defer stop()
			cli, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			return demo.WorkflowWorker(ctx, cli, a.namespace, worker, children, ttl, a.stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&worker, "worker-id", "", "worker id")
	f.IntVar(&children, "children", demo.DefaultChildren, "searches the agent spawns")
	f.DurationVar(&ttl, "ttl", demo.DefaultWorkflowTTL, "lease TTL")
	return cmd
}

func printSummary(w io.Writer, s demo.Summary) {
	fmt.Fprintf(w, "\nSummary\n")
	fmt.Fprintf(w, "  task %s: %s, %d of %d steps checkpointed\n", s.TaskID, s.FinalStatus, s.StepsCompleted, len(demo.StepNames))
	fmt.Fprintf(w, "  %s won the race and was killed during step %d\n", s.CrashedWorker, s.CrashedDuringStep)
	fmt.Fprintf(w, "  %s took over %d ms after the crash (TTL %d ms) and resumed at step %d\n", s.ResumedBy, s.TakeoverMillis, s.TTLMillis, s.ResumedFromStep)
	fmt.Fprintf(w, "  checkpointed steps run again: %d; steps run twice: %v (only the one in flight may be)\n", s.CheckpointedStepsRedone, s.StepsRunTwice)
	fmt.Fprintf(w, "  total %s\n", (time.Duration(s.DurationMillis) * time.Millisecond).String())
	if s.InvariantsMet {
		fmt.Fprintf(w, "  every invariant held\n")
	} else {
		fmt.Fprintf(w, "  INVARIANTS BROKEN:\n    %s\n", strings.Join(s.Violations, "\n    "))
	}
}

// demoWorkerCommand is the worker process the demo starts.
func (a *app) demoWorkerCommand() *cobra.Command {
	var (
		taskID, worker string
		ttl, step      time.Duration
	)
	cmd := &cobra.Command{
		Use:    "demo-worker",
		Short:  "One worker of drover demo (started by it)",
		Hidden: true,
		Args:   cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := task.CheckID(taskID); err != nil {
				return err
			}
			cli, err := a.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer cli.Close()
			return demo.Worker(cmd.Context(), cli, a.namespace, taskID, worker, ttl, step, a.stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&taskID, "task", demo.TaskID, "task id")
	f.StringVar(&worker, "worker-id", "", "worker id")
	f.DurationVar(&ttl, "ttl", demo.DefaultTTL, "lease TTL")
	f.DurationVar(&step, "step-duration", demo.DefaultStepDuration, "duration of each step")
	return cmd
}

func (a *app) lostUpdateCommand() *cobra.Command {
	var (
		cfg    demo.LostUpdateConfig
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "lost-update [--workers 5] [--invocations 3] [--protect none|cas|lock] [--store etcd|postgres] [--lock-backend URL]",
		Short: "Worker processes increment one thread's counter; see which protection loses updates",
		Long: `Start worker processes that each increment a counter in one thread's
checkpointed state --invocations times, with a random delay (the LLM call)
between reading and writing.

  --protect none   write on top of whatever is the head (last writer wins):
                   updates are lost, and the demo counts them
  --protect cas    optimistic: the write requires its parent to be the head;
                   on conflict, reload and redo
  --protect lock   a thread lock (--lock-backend) held across the
                   read-modify-write, its token fencing the write

It runs a private embedded etcd (and uses PostgreSQL at --database-url with
--store postgres). Exit 0 when a protected run lost nothing (and always for
--protect none, which is there to show the loss).`,
		Example: `  drover demo lost-update --protect none
  drover demo lost-update --protect cas --workers 5 --invocations 20 --json
  drover demo lost-update --protect lock --store postgres --lock-backend redis://127.0.0.1:6379/0`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case cfg.Protect != "none" && cfg.Protect != "cas" && cfg.Protect != "lock":
				return &drover.InputError{Field: "--protect", Value: cfg.Protect, Rule: "must be none, cas or lock"}
			case cfg.Store != "etcd" && cfg.Store != "postgres":
				return &drover.InputError{Field: "--store", Value: cfg.Store, Rule: "must be etcd or postgres"}
			case cfg.Workers < 1 || cfg.Workers > 100:
				return &drover.InputError{Field: "--workers", Value: cfg.Workers, Rule: "must be between 1 and 100"}
			case cfg.Invocations < 1 || cfg.Invocations > 1000:
				return &drover.InputError{Field: "--invocations", Value: cfg.Invocations, Rule: "must be between 1 and 1000"}
			case cfg.MaxDelay < 0:
				return &drover.InputError{Field: "--max-delay", Value: cfg.MaxDelay, Rule: "must not be negative"}
			}
			cfg.LockBackend = a.lockBackend
			if cfg.LockBackend == "etcd" {
				cfg.LockBackend = ""
			}
			cfg.Timeline = a.stderr
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			res, err := demo.RunLostUpdate(ctx, cfg)
			if errors.Is(err, demo.ErrStoreUnreachable) {
				return withCode(ExitUnavailable, err)
			}
			if err != nil {
				return err
			}
			if asJSON {
				if err := json.NewEncoder(a.stdout).Encode(res); err != nil {
					return err
				}
			} else {
				fmt.Fprintf(a.stdout, "protect=%s store=%s: expected %d, actual %d, lost updates %d, conflicts retried %d (%d ms)\n",
					res.Protect, res.Store, res.Expected, res.Actual, res.LostUpdates, res.ConflictsRetried, res.DurationMillis)
			}
			if res.Protect != "none" && res.LostUpdates != 0 {
				return withCode(ExitFailure, fmt.Errorf("%d updates lost with --protect %s", res.LostUpdates, res.Protect))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.Workers, "workers", 5, "worker processes")
	f.IntVar(&cfg.Invocations, "invocations", 3, "increments per worker")
	f.StringVar(&cfg.Protect, "protect", "lock", "none, cas or lock")
	f.StringVar(&cfg.Store, "store", "etcd", "checkpoint store: etcd or postgres")
	f.StringVar(&cfg.DatabaseURL, "database-url", demo.DefaultDatabaseURL, "PostgreSQL URL for --store postgres")
	f.StringVar(&a.lockBackend, "lock-backend", "etcd", "lock backend for --protect lock: etcd, redis://HOST:PORT/DB, redlock://H:P,H:P,H:P or paxos://H:P,H:P,H:P")
	f.DurationVar(&cfg.MaxDelay, "max-delay", 50*time.Millisecond, "longest random delay between read and write")
	f.BoolVar(&asJSON, "json", false, `print {"expected":N,"actual":N,"lost_updates":N,"conflicts_retried":N,...}`)
	return cmd
}

func (a *app) lostUpdateWorkerCommand() *cobra.Command {
	var (
		protect, store, databaseURL, worker string
		invocations                         int
		maxDelay                            time.Duration
	)
	cmd := &cobra.Command{
		Use: "demo-lost-update-worker", Short: "One worker of drover demo lost-update (started by it)", Hidden: true, Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			cli, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			s, closeStore, err := demo.OpenStore(ctx, store, databaseURL, cli, a.namespace)
			if err != nil {
				return err
			}
			defer closeStore()
			var locker lock.Locker
			if protect == "lock" {
				l, closeLocker, err := a.locker(ctx, 5*time.Second, worker)
				if err != nil {
					return err
				}
				defer closeLocker()
				locker = l
			}
			return demo.LostUpdateWorker(ctx, s, locker, protect, invocations, maxDelay, worker, a.stdout)
		},
	}
	f := cmd.Flags()
	f.StringVar(&protect, "protect", "lock", "")
	f.StringVar(&store, "store", "etcd", "")
	f.StringVar(&databaseURL, "database-url", demo.DefaultDatabaseURL, "")
	f.StringVar(&worker, "worker-id", "", "")
	f.IntVar(&invocations, "invocations", 3, "")
	f.DurationVar(&maxDelay, "max-delay", 50*time.Millisecond, "")
	f.StringVar(&a.lockBackend, "lock-backend", "etcd", "")
	return cmd
}
