package cli

import (
	"encoding/json"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
	"github.com/spf13/cobra"
)

// signalCommand is drover signal: send a task a signal.
func (a *app) signalCommand() *cobra.Command {
	var data, idem string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "signal TASK NAME",
		Short: "Send a task a signal: a step waiting for it resumes with its data",
		Long: `Sends task TASK the signal NAME, with --data (any JSON value). A step that waits for
the signal (task.WaitSignal in Go, wait_signal over HTTP) resumes with it; a task parked
WAITING for it becomes PENDING at once. A signal sent before the task waits is kept for
the wait. The same NAME and --idempotency-key sent again is delivered once: give a key
when a retry must not count twice. Exit 1 for an unknown or finished task.`,
		Example: `  drover signal plan-7 approval --data '{"approved": true, "by": "ana"}'
  drover signal plan-7 approval --data '{"approved": false}' --idempotency-key review-42 --json`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkTaskIDs(args[:1]); err != nil {
				return err
			}
			if err := task.CheckSignalName(args[1]); err != nil {
				return err
			}
			if idem != "" {
				if err := drover.Rename(task.CheckIdempotencyKey(idem), "--idempotency-key"); err != nil {
					return err
				}
			}
			var raw json.RawMessage
			if data != "" {
				if !json.Valid([]byte(data)) {
					return &drover.InputError{Field: "--data", Value: data, Rule: `must be JSON, such as '{"approved": true}' or '"yes"'`}
				}
				raw = json.RawMessage(data)
			}
			c, done, err := a.queueClient(cmd.Context())
			if err != nil {
				return err
			}
			defer done()
			res, err := c.Signal(cmd.Context(), args[0], args[1], raw, idem)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(struct {
					TaskID string `json:"task_id"`
					Name   string `json:"name"`
					queue.SignalResult
				}{args[0], args[1], res})
			}
			switch {
			case res.Woke:
				fmt.Fprintf(a.stdout, "signal %s sent to %s (key %s): it was waiting for it and resumes\n", args[1], args[0], res.IdempotencyKey)
			case res.Stored:
				fmt.Fprintf(a.stdout, "signal %s sent to %s (key %s): kept until a step waits for it (the task is %s)\n", args[1], args[0], res.IdempotencyKey, res.Status)
			default:
				fmt.Fprintf(a.stdout, "signal %s with key %s was sent to %s before: nothing sent again\n", args[1], res.IdempotencyKey, args[0])
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "", "the signal's data: any JSON value")
	cmd.Flags().StringVar(&idem, "idempotency-key", "", "the signal's idempotency key (default: a random one)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printTaskSignals prints a task as printTask does, with what it waits
// for and the signals it received.
func (a *app) printTaskSignals(t *queue.Task, sigs []task.SignalRecord, asJSON bool) error {
	if asJSON {
		v := queue.NewView(t)
		v.Signals = sigs
		return json.NewEncoder(a.stdout).Encode(v)
	}
	if err := a.printTask(t, false); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	if w := t.WaitingFor; w != nil && t.CurrentStatus == queue.Waiting {
		until := "no timeout"
		if !w.Until.IsZero() {
			until = "until " + w.Until.Format(time.RFC3339)
		}
		what := "signal " + strings.Join(w.Signals, " or ")
		if c := w.Children; c != nil {
			what = fmt.Sprintf("%d of the %d children of step %d", c.Wait, c.N, c.Step)
		}
		fmt.Fprintf(tw, "waits for:\t%s, since %s, %s\n", what, w.Since.Format(time.RFC3339), until)
	}
	if len(sigs) > 0 {
		fmt.Fprintln(tw, "signals:")
		for _, s := range sigs {
			state := "waiting to be consumed"
			if s.Consumed {
				state = "consumed " + s.ConsumedAt.Format(time.RFC3339Nano)
			}
			fmt.Fprintf(tw, "  %s\tkey %s\tsent %s\t%s\t%s\n", s.Name, s.IdempotencyKey, s.SentAt.Format(time.RFC3339Nano), state, firstLine(string(s.Data), 60))
		}
	}
	return tw.Flush()
}
