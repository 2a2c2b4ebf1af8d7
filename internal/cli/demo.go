package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover/internal/demo"
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
			if errors.Is(err, demo.ErrInvariant) {
				return withCode(ExitFailure, err)
			}
			return err
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the summary as one JSON object on stdout (the timeline goes to stderr)")
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
