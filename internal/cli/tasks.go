package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

// queueClient connects and returns a queue client, and its closer.
func (a *app) queueClient(ctx context.Context) (*queue.Client, func(), error) {
	if err := a.checkGlobal(); err != nil {
		return nil, nil, err
	}
	cli, err := a.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	c, err := queue.NewClient(cli, a.namespace)
	if err != nil {
		cli.Close()
		return nil, nil, err
	}
	return c, func() { cli.Close() }, nil
}

// queueFor validates --queue, then connects: bad input never waits for etcd.
func (a *app) queueFor(ctx context.Context, q string) (*queue.Client, func(), error) {
	if err := drover.Rename(queue.CheckQueue(q), "--queue"); err != nil {
		return nil, nil, err
	}
	return a.queueClient(ctx)
}

// getTask validates id, connects and reads the task.
func (a *app) getTask(ctx context.Context, id string) (*queue.Task, error) {
	if err := checkTaskIDs([]string{id}); err != nil {
		return nil, err
	}
	c, done, err := a.queueClient(ctx)
	if err != nil {
		return nil, err
	}
	defer done()
	return c.Get(ctx, id)
}

func checkTaskIDs(ids []string) error {
	for _, id := range ids {
		if err := keyspace.CheckName("task id", id); err != nil {
			return err
		}
	}
	return nil
}

func (a *app) printTasks(tasks []*queue.Task, asJSON bool) error {
	if asJSON {
		if tasks == nil {
			tasks = []*queue.Task{}
		}
		return json.NewEncoder(a.stdout).Encode(tasks)
	}
	if len(tasks) == 0 {
		fmt.Fprintln(a.stdout, "no tasks")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tTYPE\tSTATUS\tATTEMPT\tRETRIES\tCREATED\tLAST ERROR")
	for _, t := range tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%s\t%s\n", t.ID, t.Type, t.CurrentStatus, t.Attempt, t.RetriesAttempted, t.Retries(),
			t.Metadata.CreatedAt.Format(time.RFC3339), firstLine(t.LastError, 60))
	}
	return tw.Flush()
}

func firstLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	if len(s) > n {
		s = s[:n] + "…"
	}
	return s
}

func (a *app) printTask(t *queue.Task, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(a.stdout).Encode(t)
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "task:\t%s\n", t.ID)
	fmt.Fprintf(tw, "type:\t%s\n", t.Type)
	fmt.Fprintf(tw, "queue:\t%s\n", t.Queue)
	fmt.Fprintf(tw, "status:\t%s\n", t.CurrentStatus)
	fmt.Fprintf(tw, "attempt:\t%d (retries %d of %d)\n", t.Attempt, t.RetriesAttempted, t.Retries())
	if t.Token != 0 {
		fmt.Fprintf(tw, "token:\t%d\n", t.Token)
	}
	if !t.ScheduledAt.IsZero() && t.CurrentStatus == queue.Retrying {
		fmt.Fprintf(tw, "next attempt:\t%s\n", t.ScheduledAt.Format(time.RFC3339))
	}
	if t.LastError != "" {
		fmt.Fprintf(tw, "last error:\t%s\n", firstLine(t.LastError, 200))
	}
	if len(t.Result) > 0 {
		fmt.Fprintf(tw, "result:\t%s\n", firstLine(string(t.Result), 200))
	}
	fmt.Fprintln(tw, "history:")
	for _, tr := range t.Transitions {
		fmt.Fprintf(tw, "  %s\t%s\tattempt %d\t%s\t%s\n", tr.At.Format(time.RFC3339Nano), tr.Status, tr.Attempt, tr.Worker, firstLine(tr.Error, 80))
	}
	return tw.Flush()
}

func (a *app) tasksCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tasks",
		Short: "Inspect and cancel queued tasks",
		Example: `  drover tasks stats --queue emails
  drover tasks list --queue emails --status RETRYING
  drover tasks get 7f3a91 --json
  drover tasks cancel 7f3a91`,
	}
	var asJSON bool
	get := &cobra.Command{
		Use: "get ID", Short: "Show a task, its status and its history", Args: cobra.ExactArgs(1),
		Example: "  drover tasks get 7f3a91 --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := a.getTask(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return a.printTask(t, asJSON)
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	var q, status string
	var limit int
	list := &cobra.Command{
		Use: "list --queue Q --status S", Short: "List a queue's tasks in one status", Args: cobra.NoArgs,
		Example: "  drover tasks list --queue emails --status DEAD --limit 20 --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.queueFor(cmd.Context(), q)
			if err != nil {
				return err
			}
			defer done()
			ts, err := c.List(cmd.Context(), q, queue.Status(strings.ToUpper(status)), limit)
			if err != nil {
				return drover.Rename(err, "--status")
			}
			return a.printTasks(ts, asJSON)
		},
	}
	list.Flags().StringVar(&q, "queue", "", "queue name")
	list.Flags().StringVar(&status, "status", "PENDING", "PENDING, RUNNING, RETRYING, SUCCEEDED, DEAD or CANCELLED")
	list.Flags().IntVar(&limit, "limit", 100, "most tasks listed")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	stats := &cobra.Command{
		Use: "stats --queue Q", Short: "Count a queue's tasks by status", Args: cobra.NoArgs,
		Example: "  drover tasks stats --queue emails --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.queueFor(cmd.Context(), q)
			if err != nil {
				return err
			}
			defer done()
			st, err := c.Stats(cmd.Context(), q)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(st)
			}
			fmt.Fprintf(a.stdout, "queue %s: pending %d, running %d, retrying %d, succeeded %d, dead %d, cancelled %d\n",
				q, st.Pending, st.Running, st.Retrying, st.Succeeded, st.Dead, st.Cancelled)
			return nil
		},
	}
	stats.Flags().StringVar(&q, "queue", "", "queue name")
	stats.Flags().BoolVar(&asJSON, "json", false, "print JSON")

	cancel := &cobra.Command{
		Use: "cancel ID", Short: "Cancel a task; a running one has its context cancelled and its process killed", Args: cobra.ExactArgs(1),
		Example: "  drover tasks cancel 7f3a91",
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkTaskIDs(args); err != nil {
				return err
			}
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			t, err := c.Cancel(cmd.Context(), args[0])
			if errors.Is(err, queue.ErrFinished) {
				return withCode(ExitFailure, err)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "task %s cancelled\n", t.ID)
			return nil
		},
	}
	cmd.AddCommand(get, list, stats, cancel)
	return cmd
}

func (a *app) dlqCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "The dead-letter queue: tasks that failed for good",
		Example: `  drover dlq list --queue emails
  drover dlq show 7f3a91
  drover dlq requeue --queue emails --all
  drover dlq purge --queue emails 7f3a91`,
	}
	var (
		q      string
		asJSON bool
		all    bool
		limit  int
	)
	list := &cobra.Command{
		Use: "list --queue Q", Short: "List a queue's dead tasks", Args: cobra.NoArgs,
		Example: "  drover dlq list --queue emails --json",
		RunE: func(cmd *cobra.Command, args []string) error {
			c, done, err := a.queueFor(cmd.Context(), q)
			if err != nil {
				return err
			}
			defer done()
			ts, err := c.List(cmd.Context(), q, queue.Dead, limit)
			if err != nil {
				return err
			}
			return a.printTasks(ts, asJSON)
		},
	}
	list.Flags().StringVar(&q, "queue", "", "queue name")
	list.Flags().IntVar(&limit, "limit", 100, "most tasks listed")
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	show := &cobra.Command{
		Use: "show ID", Short: "Show a dead task with its full error history", Args: cobra.ExactArgs(1),
		Example: "  drover dlq show 7f3a91",
		RunE: func(cmd *cobra.Command, args []string) error {
			t, err := a.getTask(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if t.CurrentStatus != queue.Dead {
				return withCode(ExitFailure, fmt.Errorf("%w: %s is %s", queue.ErrNotDead, t.ID, t.CurrentStatus))
			}
			return a.printTask(t, asJSON)
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	each := func(use, short, example string, f func(*queue.Client, context.Context, []string) (int, error), verb string) *cobra.Command {
		c := &cobra.Command{
			Use: use, Short: short, Example: example,
			RunE: func(cmd *cobra.Command, args []string) error {
				if err := drover.Rename(queue.CheckQueue(q), "--queue"); err != nil {
					return err
				}
				if all == (len(args) > 0) {
					return usageError{errors.New("give task ids or --all, not both and not neither")}
				}
				if err := checkTaskIDs(args); err != nil {
					return err
				}
				qc, done, err := a.queueClient(cmd.Context())
				if err != nil {
					return err
				}
				defer done()
				n, err := f(qc, cmd.Context(), args)
				fmt.Fprintf(a.stdout, "%s %d tasks\n", verb, n)
				return err
			},
		}
		c.Flags().StringVar(&q, "queue", "", "queue name")
		c.Flags().BoolVar(&all, "all", false, "every dead task of the queue")
		return c
	}
	requeue := each("requeue --queue Q (ID... | --all)", "Put dead tasks back in the queue with a fresh retry budget",
		"  drover dlq requeue --queue emails --all",
		func(c *queue.Client, ctx context.Context, ids []string) (int, error) { return c.Requeue(ctx, q, ids) }, "requeued")
	purge := each("purge --queue Q (ID... | --all)", "Delete dead tasks for good",
		"  drover dlq purge --queue emails --all",
		func(c *queue.Client, ctx context.Context, ids []string) (int, error) { return c.Purge(ctx, q, ids) }, "purged")
	cmd.AddCommand(list, show, requeue, purge)
	return cmd
}
