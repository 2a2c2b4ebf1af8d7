package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

func (a *app) tasksCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tasks",
		Short: "Inspect, wait for, cancel and purge queued tasks",
		Example: `  drover tasks stats --queue emails
  drover tasks list --queue emails --status RETRYING
  drover tasks search --queue emails --type summarize --since 1h
  drover tasks get 7f3a91 --json
  drover tasks wait 7f3a91 --timeout 5m
  drover tasks follow 7f3a91
  drover tasks cancel 7f3a91
  drover tasks cancel --queue emails --status PENDING --all`,
	}
	var asJSON bool
	var kids int
	var kidsAfter string
	get := &cobra.Command{
		Use:   "get ID",
		Short: "Show a task, its status and its history, what it waits for, its signals, its parent and its children",
		Args:  cobra.ExactArgs(1),
		Example: `  drover tasks get 7f3a91 --json
  drover tasks get research-1 --children 100 --children-after 1:0:100`,
		RunE: func(cmd *cobra.Command, args []string) error {
			t, f, err := a.getTaskFamily(cmd.Context(), args[0], kidsAfter, kids)
			if err != nil {
				return err
			}
			return a.printTaskFamily(t, f, a.globalFlags()+fmt.Sprintf("tasks get %s --children %d", args[0], kids), asJSON)
		},
	}
	get.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	get.Flags().IntVar(&kids, "children", 20, "list at most this many of the task's children (1 to 200); the counts cover them all")
	get.Flags().StringVar(&kidsAfter, "children-after", "", "list the children from this cursor on (printed after a page that has more)")
	cmd.AddCommand(get, a.tasksListCommand(), a.tasksSearchCommand(), a.tasksStatsCommand(), a.tasksWaitCommand(), a.tasksCancelCommand(), a.tasksPurgeCommand(), a.tasksRequeueCommand(), a.tasksFollowCommand())
	return cmd
}

// listFlags are the flags of a paged listing.
type listFlags struct {
	q, status, after string
	limit            int
	asJSON           bool
}

func (f *listFlags) register(cmd *cobra.Command, withStatus bool) {
	cmd.Flags().StringVar(&f.q, "queue", "", "queue name")
	if withStatus {
		cmd.Flags().StringVar(&f.status, "status", "PENDING", "SCHEDULED, PENDING, RUNNING, RETRYING, SLEEPING, WAITING, SUCCEEDED, DEAD or CANCELLED")
	}
	cmd.Flags().IntVar(&f.limit, "limit", queue.DefaultListLimit, fmt.Sprintf("most tasks listed (1 to %d)", queue.MaxListLimit))
	cmd.Flags().StringVar(&f.after, "after", "", "start after this cursor: the next of the page before (--json), or the one the last page printed")
	cmd.Flags().BoolVar(&f.asJSON, "json", false, `print JSON: {"tasks": [...], "next": CURSOR}, next absent on the last page`)
}

// list prints one page of queue f.q's tasks in status st.
func (a *app) list(ctx context.Context, f *listFlags, st queue.Status, again string) error {
	if f.limit < 1 || f.limit > queue.MaxListLimit {
		return &drover.InputError{Field: "--limit", Value: f.limit, Rule: fmt.Sprintf("must be between 1 and %d", queue.MaxListLimit)}
	}
	c, done, err := a.queueFor(ctx, f.q)
	if err != nil {
		return err
	}
	defer done()
	page, err := c.List(ctx, f.q, st, queue.ListOptions{Limit: f.limit, After: f.after})
	if err != nil {
		return drover.Rename(drover.Rename(err, "--status"), "--after")
	}
	if len(page.Tasks) == 0 && f.after == "" {
		if err := a.mustExist(ctx, c, f.q); err != nil {
			return err
		}
	}
	return a.printPage(page, f.asJSON, again)
}

// mustExist fails with exit 1 when queue q was never used: a misspelt name
// would otherwise show as an empty queue.
func (a *app) mustExist(ctx context.Context, c *queue.Client, q string) error {
	ok, err := c.Exists(ctx, q)
	if err != nil {
		return err
	}
	if !ok {
		return withCode(ExitFailure, fmt.Errorf("queue %s does not exist: nothing was ever submitted to it; check the name (drover queues list)", q))
	}
	return nil
}

func (a *app) tasksListCommand() *cobra.Command {
	var f listFlags
	cmd := &cobra.Command{
		Use: "list --queue Q --status S", Short: "List a queue's tasks in one status, a page at a time", Args: cobra.NoArgs,
		Example: `  drover tasks list --queue emails --status DEAD --limit 20 --json
  drover tasks list --queue emails --status PENDING --after 017/0990001763820000000000000-t-17`,
		RunE: func(cmd *cobra.Command, args []string) error {
			st := queue.Status(strings.ToUpper(f.status))
			return a.list(cmd.Context(), &f, st, fmt.Sprintf("drover tasks list --queue %s --status %s --limit %d", f.q, st, f.limit))
		},
	}
	f.register(cmd, true)
	return cmd
}

func (a *app) tasksStatsCommand() *cobra.Command {
	var q string
	var asJSON bool
	cmd := &cobra.Command{
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
			if st.Total() == 0 {
				if err := a.mustExist(cmd.Context(), c, q); err != nil {
					return err
				}
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(st)
			}
			paused := ""
			if st.Paused {
				paused = " (paused: drover queues resume " + q + ")"
			}
			fmt.Fprintf(a.stdout, "queue %s: pending %d, running %d, retrying %d, succeeded %d, dead %d, cancelled %d, scheduled %d, sleeping %d, waiting %d%s\n",
				q, st.Pending, st.Running, st.Retrying, st.Succeeded, st.Dead, st.Cancelled, st.Scheduled, st.Sleeping, st.Waiting, paused)
			return nil
		},
	}
	cmd.Flags().StringVar(&q, "queue", "", "queue name")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) tasksWaitCommand() *cobra.Command {
	var timeout time.Duration
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "wait ID",
		Short: "Wait until a task finishes, then print its result",
		Long: `Blocks until the task is SUCCEEDED, DEAD or CANCELLED (it watches the task,
it does not poll), then prints its result (or with --json the whole task).
Exit codes: 0 SUCCEEDED; 1 DEAD or CANCELLED (the last error on stderr);
75 still unfinished when --timeout ran out.`,
		Example: `  drover submit --queue reports --type render --id r-42
  drover tasks wait r-42 --timeout 10m > report.json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if timeout < 0 {
				return &drover.InputError{Field: "--timeout", Value: timeout, Rule: "must not be negative (0: wait as long as it takes)"}
			}
			if err := checkTaskIDs(args); err != nil {
				return err
			}
			ctx := cmd.Context()
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			t, err := c.Wait(ctx, args[0])
			if err != nil && t != nil && errors.Is(err, context.DeadlineExceeded) {
				return withCode(ExitBusy, fmt.Errorf("task %s is still %s after %s; wait again later", t.ID, t.CurrentStatus, timeout))
			}
			if err != nil {
				return err
			}
			if asJSON {
				if err := json.NewEncoder(a.stdout).Encode(queue.NewView(t)); err != nil {
					return err
				}
			} else if len(t.Result) > 0 {
				_, _ = a.stdout.Write(t.Result)
				if t.Result[len(t.Result)-1] != '\n' {
					fmt.Fprintln(a.stdout)
				}
			}
			if t.CurrentStatus != queue.Succeeded {
				msg := fmt.Sprintf("task %s is %s", t.ID, t.CurrentStatus)
				if t.LastError != "" {
					msg += ": " + firstLine(t.LastError, 500)
				}
				return withCode(ExitFailure, errors.New(msg))
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 0, "give up after this long, exit 75 (0: no limit)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the whole task as JSON")
	return cmd
}
