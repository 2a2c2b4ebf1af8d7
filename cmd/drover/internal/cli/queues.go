package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cmd/drover/internal/progress"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

func (a *app) queuesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "List, configure and delete queues: maximum depth (backpressure), exact FIFO",
		Long: `A queue can have a maximum depth: once it holds that many unfinished tasks
(pending, running or waiting to retry), submissions fail fast (drover submit
exits 75) instead of growing etcd without bound.`,
		Example: `  drover queues list
  drover queues set emails --max-depth 100000
  drover queues set approvals --fifo
  drover queues get emails --json
  drover queues delete old-emails --yes
  drover queues pause emails
  drover queues resume emails
  drover queues history emails --window 24h`,
	}
	cmd.AddCommand(a.queuesSetCommand(), a.queuesGetCommand(), a.queuesListCommand(), a.queuesDeleteCommand(),
		a.queuesPauseCommand(true), a.queuesPauseCommand(false))
	cmd.AddCommand(a.queuesHistoryCommand())
	return cmd
}

func (a *app) queuesSetCommand() *cobra.Command {
	var (
		maxDepth int64
		fifo     bool
		setJSON  bool
	)
	cmd := &cobra.Command{
		Use:     "set Q [--max-depth N] [--fifo]",
		Short:   "Change a queue's settings (0: no bound)",
		Example: `  drover queues set emails --max-depth 100000`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := drover.Rename(queue.CheckQueue(args[0]), "Q"); err != nil {
				return err
			}
			if !cmd.Flags().Changed("max-depth") && !cmd.Flags().Changed("fifo") {
				return usageError{fmt.Errorf("nothing to set: give --max-depth N or --fifo")}
			}
			if maxDepth < 0 || maxDepth > queue.MaxMaxDepth {
				return &drover.InputError{Field: "--max-depth", Value: maxDepth, Rule: fmt.Sprintf("must be between 0 (no bound) and %d", int64(queue.MaxMaxDepth))}
			}
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			var cfg queue.Config
			if err := c.UpdateConfig(cmd.Context(), args[0], func(old *queue.Config) {
				if cmd.Flags().Changed("max-depth") {
					old.MaxDepth = maxDepth
				}
				if cmd.Flags().Changed("fifo") {
					old.FIFO = fifo
				}
				cfg = *old
			}); err != nil {
				return err
			}
			if setJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"queue": args[0], "max_depth": cfg.MaxDepth, "fifo": cfg.FIFO})
			}
			fmt.Fprintf(a.stdout, "queue %s: max depth %d, fifo %t\n", args[0], cfg.MaxDepth, cfg.FIFO)
			return nil
		},
	}
	cmd.Flags().BoolVar(&setJSON, "json", false, "print the settings as JSON")
	cmd.Flags().Int64Var(&maxDepth, "max-depth", 0, "most unfinished tasks the queue holds (0: no bound)")
	cmd.Flags().BoolVar(&fifo, "fifo", false, "claim equal priorities exactly in submission order (tasks submitted from now on; keep such queues to about 100,000 tasks)")
	return cmd
}

func (a *app) queuesGetCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "get Q [--json]",
		Short:   "Show a queue's settings and depth",
		Example: `  drover queues get emails --json`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := drover.Rename(queue.CheckQueue(args[0]), "Q"); err != nil {
				return err
			}
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			cfg, err := c.GetConfig(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			st, err := c.Stats(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if st.Total() == 0 && cfg == (queue.Config{}) {
				if err := a.mustExist(cmd.Context(), c, args[0]); err != nil {
					return err
				}
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"queue": args[0], "max_depth": cfg.MaxDepth, "fifo": cfg.FIFO, "depth": st.Unfinished(), "paused": st.Paused})
			}
			fmt.Fprintf(a.stdout, "queue %s: depth %d, max depth %d (0: no bound), fifo %t, paused %t\n", args[0], st.Unfinished(), cfg.MaxDepth, cfg.FIFO, st.Paused)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) queuesListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list [--json]",
		Short:   "List every queue that was submitted to or configured, with its counts",
		Example: `  drover queues list --json`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			qs, err := c.Queues(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(qs)
			}
			if len(qs) == 0 {
				fmt.Fprintln(a.stdout, "no queues")
				return nil
			}
			tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "QUEUE\tPENDING\tRUNNING\tRETRYING\tSUCCEEDED\tDEAD\tCANCELLED\tMAX DEPTH\tFIFO\tPAUSED")
			for _, q := range qs {
				s := q.Stats
				fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%t\t%t\n", q.Name, s.Pending, s.Running, s.Retrying, s.Succeeded, s.Dead, s.Cancelled, q.Config.MaxDepth, q.Config.FIFO, s.Paused)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) queuesDeleteCommand() *cobra.Command {
	var yes, asJSON bool
	cmd := &cobra.Command{
		Use:   "delete Q --yes",
		Short: "Delete a queue with every task in it, for good",
		Long: `Deletes queue Q: every pending, retrying, dead and finished task in it
(records, checkpoints, index keys), its settings, and its entry in
drover queues list. It refuses while tasks of the queue are running: stop
its workers first. Stop submitting to it first too: a task submitted during
the deletion may survive it. Shows progress on stderr.`,
		Example: `  drover queues delete old-emails --yes`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := drover.Rename(queue.CheckQueue(args[0]), "Q"); err != nil {
				return err
			}
			if !yes {
				return usageError{fmt.Errorf("deleting queue %s deletes every task in it for good: add --yes", args[0])}
			}
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			prog := progress.New(a.stderr, "delete", 0)
			n, err := c.DeleteQueue(cmd.Context(), args[0], func(done int) { prog.Update(0, done) })
			prog.Done()
			if errors.Is(err, queue.ErrNoQueue) || errors.Is(err, queue.ErrQueueBusy) {
				return withCode(ExitFailure, err)
			}
			if err != nil {
				return fmt.Errorf("%w (%d tasks deleted so far; run the command again to finish)", err, n)
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"queue": args[0], "deleted_tasks": n})
			}
			fmt.Fprintf(a.stdout, "queue %s deleted with %d tasks\n", args[0], n)
			return nil
		},
	}
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm: delete the queue and its tasks for good")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// queuesPauseCommand is `drover queues pause Q` (pause) or `drover queues
// resume Q`.
func (a *app) queuesPauseCommand(pause bool) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "pause Q [--json]",
		Short: "Pause a queue: it takes submissions, but no worker claims its tasks until resumed",
		Long: `Pauses queue Q. From the moment the command returns, no claim of Q's tasks
commits, in any process: Go workers, drover worker processes and HTTP
workers alike (every claim transaction is fenced by the pause). Submissions
are accepted and tasks already running finish and are acknowledged as
usual; idle workers wait without polling until drover queues resume Q. The
pause is stored in etcd: it survives restarts. Pausing a paused queue is
not an error. Exits 1 when Q was never submitted to or configured.`,
		Example: `  drover queues pause emails
  drover queues pause emails --json`,
		Args: cobra.ExactArgs(1),
	}
	if !pause {
		cmd.Use = "resume Q [--json]"
		cmd.Short = "Resume a paused queue: its workers claim again within a second"
		cmd.Long = `Resumes queue Q: idle workers and waiting HTTP claims learn of it from
their watch of the queue and claim again at once. Resuming a queue that is
not paused is not an error. Exits 1 when Q was never submitted to or
configured.`
		cmd.Example = `  drover queues resume emails
  drover queues resume emails --json`
	}
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		if err := drover.Rename(queue.CheckQueue(args[0]), "Q"); err != nil {
			return err
		}
		c, done, err := a.queueClient(cmd.Context())
		if err != nil {
			return err
		}
		defer done()
		set := c.Resume
		if pause {
			set = c.Pause
		}
		st, err := set(cmd.Context(), args[0])
		if errors.Is(err, queue.ErrNoQueue) {
			return withCode(ExitFailure, err)
		}
		if err != nil {
			return err
		}
		if asJSON {
			return json.NewEncoder(a.stdout).Encode(st)
		}
		state, was := "paused", "already "
		if !st.Paused {
			state = "resumed"
			was = "was not paused; "
		}
		if st.Changed {
			was = ""
		}
		fmt.Fprintf(a.stdout, "queue %s: %s%s\n", args[0], was, state)
		return nil
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the queue's pause state as JSON")
	return cmd
}
