package cli

import (
	"encoding/json"
	"fmt"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

func (a *app) queuesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "queues",
		Short: "A queue's settings: maximum depth (backpressure), exact FIFO",
		Long: `A queue can have a maximum depth: once it holds that many unfinished tasks
(pending, running or waiting to retry), submissions fail fast (drover submit
exits 75) instead of growing etcd without bound.`,
		Example: `  drover queues set emails --max-depth 100000
  drover queues set approvals --fifo
  drover queues get emails --json`,
	}
	var (
		maxDepth int64
		fifo     bool
	)
	set := &cobra.Command{
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
			fmt.Fprintf(a.stdout, "queue %s: max depth %d, fifo %t\n", args[0], cfg.MaxDepth, cfg.FIFO)
			return nil
		},
	}
	set.Flags().Int64Var(&maxDepth, "max-depth", 0, "most unfinished tasks the queue holds (0: no bound)")
	set.Flags().BoolVar(&fifo, "fifo", false, "claim equal priorities exactly in submission order (tasks submitted from now on; keep such queues to about 100,000 tasks)")
	var asJSON bool
	get := &cobra.Command{
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
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(map[string]any{"queue": args[0], "max_depth": cfg.MaxDepth, "fifo": cfg.FIFO, "depth": st.Unfinished()})
			}
			fmt.Fprintf(a.stdout, "queue %s: depth %d, max depth %d (0: no bound), fifo %t\n", args[0], st.Unfinished(), cfg.MaxDepth, cfg.FIFO)
			return nil
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(set, get)
	return cmd
}
