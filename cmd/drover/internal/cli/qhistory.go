package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/httpapi"
	"github.com/droverhq/drover/internal/qstats"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
)

func (a *app) queuesHistoryCommand() *cobra.Command {
	var (
		window string
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "history Q [--window 1h|24h] [--json]",
		Short: "Show a queue's history per minute: processed, failed, retried, deferred, depth, latency to start",
		Long: `Every drover server counts what the queue's workers write and closes each
minute into a small record in etcd: tasks that succeeded (processed), failed
for good (failed), were scheduled for a retry (retried) or deferred by flow
control (deferred), the queue's depth at the minute's end, and the time from
a task's submission (or due time) to its first claim. The history needs a
drover server with --http-listen on the namespace; a day of it is kept.

The table lists the minutes in which something was counted; --json prints
every minute of the window, as GET /v1/queues/{queue}/history answers.`,
		Example: `  drover queues history emails
  drover queues history emails --window 24h --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			q := args[0]
			if err := drover.Rename(queue.CheckQueue(q), "Q"); err != nil {
				return err
			}
			w, err := time.ParseDuration(window)
			if err != nil || qstats.CheckWindow("--window", w) != nil {
				return &drover.InputError{Field: "--window", Value: window, Rule: "must be 1h or 24h"}
			}
			cli, done, err := a.etcd(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			c, err := queue.NewClient(cli, a.namespace)
			if err != nil {
				return err
			}
			if err := a.mustExist(cmd.Context(), c, q); err != nil {
				return err
			}
			h, err := qstats.Read(cmd.Context(), cli, a.namespace, q, w, time.Now())
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(httpapi.QueueHistoryOf(h))
			}
			a.printHistory(h)
			return nil
		},
	}
	cmd.Flags().StringVar(&window, "window", "1h", "the window: 1h (the last hour) or 24h (the last day)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print every minute as JSON")
	return cmd
}

// printHistory prints h's totals, then a line per minute that counted
// something.
func (a *app) printHistory(h *qstats.History) {
	closed := "no minute closed yet: is a drover server running on this namespace?"
	if !h.ClosedThrough.IsZero() {
		closed = "closed through " + h.ClosedThrough.Local().Format("15:04")
	}
	fmt.Fprintf(a.stdout, "queue %s, the last %s (%s)\n", h.Queue, windowName(h.Window), closed)
	t := h.Total
	fmt.Fprintf(a.stdout, "processed %d, failed %d, retried %d, deferred %d; latency to start p50 %s, p99 %s (%d tasks)\n",
		t.Processed, t.Failed, t.Retried, t.Deferred, h.Latency.Percentile(0.5).Round(time.Millisecond),
		h.Latency.Percentile(0.99).Round(time.Millisecond), h.Latency.Count())
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MINUTE\tPROCESSED\tFAILED\tRETRIED\tDEFERRED\tPENDING\tRUNNING\tRETRYING\tP50\tP99")
	for _, m := range h.Minutes {
		if m.Counts == (qstats.Counts{}) {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\n", m.At.Local().Format("01-02 15:04"), m.Processed, m.Failed,
			m.Retried, m.Deferred, m.Pending, m.Running, m.Retrying, m.Latency.Percentile(0.5).Round(time.Millisecond),
			m.Latency.Percentile(0.99).Round(time.Millisecond))
	}
	tw.Flush()
}

func windowName(w time.Duration) string {
	if w == qstats.Day {
		return "day"
	}
	return "hour"
}
