package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cmd/drover/internal/progress"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

// bulkFlags are the flags of a command that changes many tasks at once.
type bulkFlags struct {
	q, status string
	all       bool
	asJSON    bool
}

// bulkResult is the JSON form of a bulk change.
type bulkResult struct {
	Queue  string `json:"queue"`
	Status string `json:"status"`
	Action string `json:"action"`
	Count  int    `json:"count"`
}

// runBulk checks the flags, connects, runs f over the named tasks (or all
// of the status with --all) with progress on stderr, and prints the count.
func (a *app) runBulk(ctx context.Context, b *bulkFlags, ids []string, st queue.Status, action string,
	f func(c *queue.Client, ctx context.Context, ids []string, progress func(int)) (int, error)) error {
	if err := drover.Rename(queue.CheckQueue(b.q), "--queue"); err != nil {
		return err
	}
	if b.all == (len(ids) > 0) {
		return usageError{errors.New("give task ids or --all, not both and not neither")}
	}
	if err := checkTaskIDs(ids); err != nil {
		return err
	}
	c, done, err := a.queueClient(ctx)
	if err != nil {
		return err
	}
	defer done()
	if b.all {
		if err := a.mustExist(ctx, c, b.q); err != nil {
			return err
		}
	}
	prog := progress.New(a.stderr, action, 0)
	n, err := f(c, ctx, ids, func(done int) { prog.Update(0, done) })
	prog.Done()
	if b.asJSON {
		if jerr := json.NewEncoder(a.stdout).Encode(bulkResult{Queue: b.q, Status: string(st), Action: action, Count: n}); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintf(a.stdout, "%s %d tasks\n", action, n)
	}
	if errors.Is(err, queue.ErrWrongStatus) || errors.Is(err, queue.ErrNotDead) || errors.Is(err, queue.ErrNotFound) {
		return withCode(ExitFailure, err)
	}
	return err
}

// status reads --status for a bulk change, which allows only some.
func (b *bulkFlags) statusOf(allowed ...queue.Status) (queue.Status, error) {
	st := queue.Status(strings.ToUpper(b.status))
	for _, s := range allowed {
		if st == s {
			return st, nil
		}
	}
	names := make([]string, len(allowed))
	for i, s := range allowed {
		names[i] = string(s)
	}
	return "", &drover.InputError{Field: "--status", Value: b.status, Rule: "must be " + strings.Join(names, " or ")}
}

func (a *app) tasksCancelCommand() *cobra.Command {
	var b bulkFlags
	cmd := &cobra.Command{
		Use:   "cancel (ID | --queue Q [--status PENDING|RETRYING] (ID... | --all))",
		Short: "Cancel a task (a running one has its context cancelled and its process killed), or many waiting ones",
		Long: `With one ID and no --queue, cancels that task whatever its state: a running
task's worker has its claim taken away and its context cancelled.

With --queue, cancels tasks of that queue that are waiting (PENDING, the
default, or RETRYING): the ids given, or every one with --all. Cancelled
tasks are kept, like finished ones, for the queue's retention.`,
		Example: `  drover tasks cancel 7f3a91
  drover tasks cancel --queue emails --status PENDING --all --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if b.q == "" && !b.all && len(args) == 1 {
				return a.cancelOne(cmd.Context(), args[0], b.asJSON)
			}
			if b.q == "" {
				return usageError{errors.New("to cancel more than one task give --queue Q, and ids or --all")}
			}
			st, err := b.statusOf(queue.Scheduled, queue.Pending, queue.Retrying, queue.Sleeping, queue.Waiting)
			if err != nil {
				return err
			}
			return a.runBulk(cmd.Context(), &b, args, st, "cancelled", func(c *queue.Client, ctx context.Context, ids []string, p func(int)) (int, error) {
				return c.CancelTasks(ctx, b.q, st, ids, p)
			})
		},
	}
	cmd.Flags().StringVar(&b.q, "queue", "", "queue of the tasks to cancel")
	cmd.Flags().StringVar(&b.status, "status", "PENDING", "SCHEDULED, PENDING, RETRYING, SLEEPING or WAITING")
	cmd.Flags().BoolVar(&b.all, "all", false, "every task of the queue in that status")
	cmd.Flags().BoolVar(&b.asJSON, "json", false, "print JSON")
	return cmd
}

// cancelOne cancels task id, running or not.
func (a *app) cancelOne(ctx context.Context, id string, asJSON bool) error {
	if err := checkTaskIDs([]string{id}); err != nil {
		return err
	}
	c, done, err := a.queueClient(ctx)
	if err != nil {
		return err
	}
	defer done()
	t, err := c.Cancel(ctx, id)
	if errors.Is(err, queue.ErrFinished) || errors.Is(err, queue.ErrNotFound) {
		return withCode(ExitFailure, err)
	}
	if err != nil {
		return err
	}
	if asJSON {
		return json.NewEncoder(a.stdout).Encode(queue.NewView(t))
	}
	fmt.Fprintf(a.stdout, "task %s cancelled\n", t.ID)
	return nil
}

func (a *app) tasksPurgeCommand() *cobra.Command {
	var b bulkFlags
	cmd := &cobra.Command{
		Use:   "purge --queue Q --status S (ID... | --all)",
		Short: "Delete tasks for good: pending, retrying, dead or finished ones",
		Long: `Deletes tasks of a queue in one status (SCHEDULED, PENDING, RETRYING, SLEEPING, WAITING,
DEAD, SUCCEEDED or CANCELLED) for good: their records, checkpoints and index keys. Running tasks
cannot be purged; cancel them first. Shows progress on stderr.`,
		Example: `  drover tasks purge --queue emails --status PENDING --all
  drover tasks purge --queue emails --status SUCCEEDED t-1 t-2 --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := b.statusOf(queue.Scheduled, queue.Pending, queue.Retrying, queue.Sleeping, queue.Waiting, queue.Dead, queue.Succeeded, queue.Cancelled)
			if err != nil {
				return err
			}
			return a.runBulk(cmd.Context(), &b, args, st, "purged", func(c *queue.Client, ctx context.Context, ids []string, p func(int)) (int, error) {
				return c.Purge(ctx, b.q, st, ids, p)
			})
		},
	}
	cmd.Flags().StringVar(&b.q, "queue", "", "queue name")
	cmd.Flags().StringVar(&b.status, "status", "", "SCHEDULED, PENDING, RETRYING, DEAD, SUCCEEDED or CANCELLED (required)")
	cmd.Flags().BoolVar(&b.all, "all", false, "every task of the queue in that status")
	cmd.Flags().BoolVar(&b.asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) tasksRequeueCommand() *cobra.Command {
	var b bulkFlags
	cmd := &cobra.Command{
		Use:   "requeue --queue Q --status S (ID... | --all)",
		Short: "Make scheduled tasks due now, or put dead tasks back",
		Long: `Requeues tasks of a queue: SCHEDULED ones become PENDING at once (their
history says they were scheduled; the other tasks of their submission keep
their time), DEAD ones go back to PENDING with a fresh retry budget (as
drover dlq requeue). Shows progress on stderr.`,
		Example: `  drover tasks requeue --queue builds --status SCHEDULED check-981
  drover tasks requeue --queue builds --status SCHEDULED --all --json`,
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := b.statusOf(queue.Scheduled, queue.Dead)
			if err != nil {
				return err
			}
			return a.runBulk(cmd.Context(), &b, args, st, "requeued", func(c *queue.Client, ctx context.Context, ids []string, p func(int)) (int, error) {
				if st == queue.Dead {
					return c.Requeue(ctx, b.q, ids, p)
				}
				return c.RunNow(ctx, b.q, ids, p)
			})
		},
	}
	cmd.Flags().StringVar(&b.q, "queue", "", "queue name")
	cmd.Flags().StringVar(&b.status, "status", "", "SCHEDULED or DEAD (required)")
	cmd.Flags().BoolVar(&b.all, "all", false, "every task of the queue in that status")
	cmd.Flags().BoolVar(&b.asJSON, "json", false, "print JSON")
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
	var f listFlags
	list := &cobra.Command{
		Use: "list --queue Q", Short: "List a queue's dead tasks, a page at a time", Args: cobra.NoArgs,
		Example: "  drover dlq list --queue emails --json\n  drover dlq list --queue emails --after t-0412",
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.list(cmd.Context(), &f, queue.Dead, fmt.Sprintf("drover dlq list --queue %s --limit %d", f.q, f.limit))
		},
	}
	f.register(list, false)
	var asJSON bool
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
	each := func(use, short, example, action string, f func(c *queue.Client, ctx context.Context, q string, ids []string, p func(int)) (int, error)) *cobra.Command {
		var b bulkFlags
		c := &cobra.Command{
			Use: use, Short: short, Example: example,
			RunE: func(cmd *cobra.Command, args []string) error {
				return a.runBulk(cmd.Context(), &b, args, queue.Dead, action, func(c *queue.Client, ctx context.Context, ids []string, p func(int)) (int, error) {
					return f(c, ctx, b.q, ids, p)
				})
			},
		}
		c.Flags().StringVar(&b.q, "queue", "", "queue name")
		c.Flags().BoolVar(&b.all, "all", false, "every dead task of the queue")
		c.Flags().BoolVar(&b.asJSON, "json", false, "print JSON")
		return c
	}
	requeue := each("requeue --queue Q (ID... | --all)", "Put dead tasks back in the queue with a fresh retry budget",
		"  drover dlq requeue --queue emails --all", "requeued",
		func(c *queue.Client, ctx context.Context, q string, ids []string, p func(int)) (int, error) {
			return c.Requeue(ctx, q, ids, p)
		})
	purge := each("purge --queue Q (ID... | --all)", "Delete dead tasks for good",
		"  drover dlq purge --queue emails --all", "purged",
		func(c *queue.Client, ctx context.Context, q string, ids []string, p func(int)) (int, error) {
			return c.Purge(ctx, q, queue.Dead, ids, p)
		})
	cmd.AddCommand(list, show, requeue, purge)
	return cmd
}
