package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/droverhq/drover/agentserver"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/schedule"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func (a *app) schedulesCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedules",
		Short: "Create and manage schedules: tasks submitted on a cron or every interval, once per tick",
		Long: `A schedule submits a task to a queue at each tick of a cron expression (read
in a time zone) or of an interval. Every drover server fires the ticks; each
tick submits exactly one task, whose id is the schedule's name and the
tick's time, however many servers run and whichever of them dies.`,
		Example: `  drover schedules create nightly --cron "0 2 * * *" --tz Europe/Paris --queue reports --type report
  drover schedules create poll --every 30s --queue builds --type check --params '{"build":981}'
  drover schedules list
  drover schedules history nightly --json
  drover schedules pause nightly`,
	}
	cmd.AddCommand(a.schedulesCreateCommand(), a.schedulesUpdateCommand(), a.schedulesListCommand(), a.schedulesGetCommand(),
		a.schedulesActionCommand("pause", "Stop a schedule's fires until resume (a trigger still fires)",
			func(ctx context.Context, c *schedule.Client, name string) (any, error) { return c.Pause(ctx, name) }),
		a.schedulesActionCommand("resume", "Fire a paused schedule again from its next tick (the ticks it missed do not fire)",
			func(ctx context.Context, c *schedule.Client, name string) (any, error) { return c.Resume(ctx, name) }),
		a.schedulesActionCommand("trigger", "Fire a schedule once now, with a task id of its own",
			func(ctx context.Context, c *schedule.Client, name string) (any, error) { return c.Trigger(ctx, name) }),
		a.schedulesActionCommand("delete", "Delete a schedule and its history (its tasks stay)",
			func(ctx context.Context, c *schedule.Client, name string) (any, error) {
				return map[string]any{"name": name, "deleted": true}, c.Delete(ctx, name)
			}),
		a.schedulesHistoryCommand())
	return cmd
}

// scheduleFlags are the flags that set a schedule's fields.
type scheduleFlags struct {
	cron, tz, queue, typ, params, overlap, catchup string
	every, window, jitter                          time.Duration
	paused, asJSON                                 bool
}

func (f *scheduleFlags) register(cmd *cobra.Command) {
	fl := cmd.Flags()
	fl.StringVar(&f.cron, "cron", "", `cron expression: 5 fields (minute hour day-of-month month day-of-week) or @daily, @hourly...`)
	fl.StringVar(&f.tz, "tz", "", "IANA time zone the cron expression is read in, such as Europe/Paris (default UTC)")
	fl.DurationVar(&f.every, "every", 0, "fire at each multiple of this interval since the Unix epoch (whole seconds, 1s or more)")
	fl.StringVar(&f.queue, "queue", "", "queue each fire submits to")
	fl.StringVar(&f.typ, "type", "", "task type each fire submits")
	fl.StringVar(&f.params, "params", "", "task parameters, a JSON value")
	fl.StringVar(&f.overlap, "overlap", "", "while the previous fire's task has not finished: skip (default), allow, buffer-one or cancel-previous")
	fl.StringVar(&f.catchup, "catchup", "", "ticks missed while no server ran: none, latest (default) or all")
	fl.DurationVar(&f.window, "catchup-window", 0, "how far back missed ticks fire (default 1h)")
	fl.DurationVar(&f.jitter, "jitter", 0, "delay each fire by up to this much, the same on every server")
	fl.BoolVar(&f.paused, "paused", false, "create or set the schedule paused")
	fl.BoolVar(&f.asJSON, "json", false, "print the schedule as JSON")
}

// apply sets the fields of s whose flags were given.
func (f *scheduleFlags) apply(cmd *cobra.Command, s *schedule.Schedule) {
	ch := cmd.Flags().Changed
	set := map[string]func(){
		"cron":           func() { s.Cron = f.cron },
		"tz":             func() { s.TZ = f.tz },
		"every":          func() { s.Every = queue.Duration(f.every) },
		"queue":          func() { s.Queue = f.queue },
		"type":           func() { s.Type = f.typ },
		"params":         func() { s.Params = json.RawMessage(f.params) },
		"overlap":        func() { s.Overlap = schedule.Overlap(f.overlap) },
		"catchup":        func() { s.Catchup = schedule.Catchup(f.catchup) },
		"catchup-window": func() { s.CatchupWindow = queue.Duration(f.window) },
		"jitter":         func() { s.Jitter = queue.Duration(f.jitter) },
		"paused":         func() { s.Paused = f.paused },
	}
	for name, fn := range set {
		if ch(name) {
			fn()
		}
	}
	if ch("cron") && !ch("every") {
		s.Every = 0 // switching to cron
	}
	if ch("every") && !ch("cron") {
		s.Cron = ""
		if !ch("tz") {
			s.TZ = "" // a --tz given with --every is refused, as over HTTP
		}
	}
}

// scheduleFlagError renames a schedule field's InputError to its flag.
func scheduleFlagError(err error) error {
	var ie *drover.InputError
	if !errors.As(err, &ie) {
		return err
	}
	switch ie.Field {
	case "name":
		return ie.Renamed("NAME")
	case "catchup_window":
		return ie.Renamed("--catchup-window")
	}
	return ie.Renamed("--" + ie.Field)
}

// withSchedules connects and runs fn with a client of the namespace's
// schedules, closing the connection once fn returns.
func (a *app) withSchedules(ctx context.Context, fn func(*schedule.Client) error) error {
	if err := a.checkGlobal(); err != nil {
		return err
	}
	cli, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: a.namespace})
	if err != nil {
		return err
	}
	return fn(c)
}

// onSchedule checks the schedule's name, then runs fn on it with
// withSchedules; fn's error gets the exit code scheduleError gives.
func (a *app) onSchedule(ctx context.Context, name string, fn func(ctx context.Context, c *schedule.Client, name string) error) error {
	if err := keyspace.CheckName("NAME", name); err != nil {
		return err
	}
	return a.withSchedules(ctx, func(c *schedule.Client) error { return scheduleError(fn(ctx, c, name)) })
}

// scheduleError gives the exit code of a schedule's error: 2 for a name
// in use (bad input), 1 for one not found.
func scheduleError(err error) error {
	switch {
	case errors.Is(err, schedule.ErrExists):
		return withCode(ExitUsage, err)
	case errors.Is(err, schedule.ErrNotFound):
		return withCode(ExitFailure, fmt.Errorf("%w; see drover schedules list", err))
	}
	return scheduleFlagError(err)
}

func (a *app) schedulesCreateCommand() *cobra.Command {
	var f scheduleFlags
	cmd := &cobra.Command{
		Use:   "create NAME (--cron EXPR [--tz ZONE] | --every D) --queue Q --type T [flags]",
		Short: "Create a schedule",
		Example: `  drover schedules create weekday-digest --cron "0 9 * * MON-FRI" --tz Europe/Paris --queue mail --type digest
  drover schedules create poll --every 30s --queue builds --type check --params '{"build":981}' --overlap skip --jitter 5s
  drover schedules create hourly --cron @hourly --queue q --type t --catchup all --catchup-window 6h --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s := schedule.Schedule{Name: args[0]}
			f.apply(cmd, &s)
			if err := s.Validate(); err != nil {
				return scheduleFlagError(err)
			}
			return a.withSchedules(cmd.Context(), func(c *schedule.Client) error {
				s, err := c.Create(cmd.Context(), s)
				if err != nil {
					return scheduleError(err)
				}
				return a.printSchedule(s, f.asJSON)
			})
		},
	}
	f.register(cmd)
	return cmd
}

func (a *app) schedulesUpdateCommand() *cobra.Command {
	var f scheduleFlags
	cmd := &cobra.Command{
		Use:   "update NAME [flags]",
		Short: "Change a schedule's fields (those whose flags are given)",
		Long: `Changing when it fires (--cron, --tz, --every, --jitter) points the schedule
at its first tick from now; other changes keep its next fire.`,
		Example: `  drover schedules update poll --every 1m
  drover schedules update nightly --params '{"full":true}' --overlap allow --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().NFlag() == 0 || (cmd.Flags().NFlag() == 1 && cmd.Flags().Changed("json")) {
				return usageError{fmt.Errorf("nothing to change: give a flag such as --every 1m (see 'drover schedules update --help')")}
			}
			return a.onSchedule(cmd.Context(), args[0], func(ctx context.Context, c *schedule.Client, name string) error {
				s, err := c.Update(ctx, name, func(s *schedule.Schedule) { f.apply(cmd, s) })
				if err != nil {
					return err
				}
				return a.printSchedule(s, f.asJSON)
			})
		},
	}
	f.register(cmd)
	return cmd
}

func (a *app) schedulesListCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "list [--json]",
		Short:   "List the schedules",
		Example: "  drover schedules list --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.withSchedules(cmd.Context(), func(c *schedule.Client) error {
				list, err := c.List(cmd.Context())
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(map[string]any{"data": list})
				}
				w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
				fmt.Fprintln(w, "NAME\tWHEN\tQUEUE\tTYPE\tNEXT FIRE\tPAUSED")
				for _, s := range list {
					fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%t\n", s.Name, when(s), s.Queue, s.Type, nextFire(s), s.Paused)
				}
				return w.Flush()
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"data": [...]}`)
	return cmd
}

func when(s schedule.Schedule) string {
	switch {
	case s.Every != 0:
		return "every " + time.Duration(s.Every).String()
	case s.TZ != "":
		return s.Cron + " (" + s.TZ + ")"
	}
	return s.Cron
}

func nextFire(s schedule.Schedule) string {
	if s.NextFireAt.IsZero() {
		return "-"
	}
	return s.NextFireAt.UTC().Format(time.RFC3339)
}

func (a *app) printSchedule(s schedule.Schedule, asJSON bool) error {
	if asJSON {
		return json.NewEncoder(a.stdout).Encode(s)
	}
	fmt.Fprintf(a.stdout, "schedule %s: %s, queue %s, type %s, overlap %s, catchup %s (window %s), next fire %s, paused %t\n",
		s.Name, when(s), s.Queue, s.Type, s.Overlap, s.Catchup, time.Duration(s.CatchupWindow), nextFire(s), s.Paused)
	return nil
}

func (a *app) schedulesGetCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "get NAME [--json]",
		Short:   "Show a schedule and its next fire",
		Example: "  drover schedules get nightly --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.onSchedule(cmd.Context(), args[0], func(ctx context.Context, c *schedule.Client, name string) error {
				s, err := c.Get(ctx, name)
				if err != nil {
					return err
				}
				return a.printSchedule(s, asJSON)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// schedulesActionCommand is pause, resume, trigger or delete: do is what
// the verb does to the named schedule, and says what to print (the
// schedule after it, the fire, or what was deleted).
func (a *app) schedulesActionCommand(verb, short string, do func(ctx context.Context, c *schedule.Client, name string) (any, error)) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     verb + " NAME [--json]",
		Short:   short,
		Example: fmt.Sprintf("  drover schedules %s nightly --json", verb),
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return a.onSchedule(cmd.Context(), args[0], func(ctx context.Context, c *schedule.Client, name string) error {
				out, err := do(ctx, c, name)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(out)
				}
				switch out := out.(type) {
				case schedule.Schedule:
					return a.printSchedule(out, false)
				case schedule.Fire:
					fmt.Fprintf(a.stdout, "schedule %s fired: task %s, %s\n", name, out.TaskID, out.Outcome)
				default:
					fmt.Fprintf(a.stdout, "schedule %s deleted\n", name)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) schedulesHistoryCommand() *cobra.Command {
	var (
		asJSON bool
		limit  int
	)
	cmd := &cobra.Command{
		Use:   "history NAME [--limit N] [--json]",
		Short: "Show a schedule's fires, newest first: nominal time, submit time, task id, outcome",
		Long: `Each tick's record: its nominal time, when its task was submitted, the task's
id, and its outcome (the task's state now; SKIPPED by the overlap policy;
MISSED: ticks that passed without a fire, with their count; REJECTED by
the queue; REMOVED after the task's retention).`,
		Example: "  drover schedules history nightly --limit 20 --json",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 1 || limit > schedule.MaxHistory {
				return &drover.InputError{Field: "--limit", Value: limit, Rule: fmt.Sprintf("must be between 1 and %d", schedule.MaxHistory)}
			}
			return a.onSchedule(cmd.Context(), args[0], func(ctx context.Context, c *schedule.Client, name string) error {
				fires, err := c.History(ctx, name, limit)
				if err != nil {
					return err
				}
				if asJSON {
					return json.NewEncoder(a.stdout).Encode(map[string]any{"data": fires})
				}
				return a.printFires(fires)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print JSON: {"data": [...]}`)
	cmd.Flags().IntVar(&limit, "limit", 100, fmt.Sprintf("most fires shown (1 to %d)", schedule.MaxHistory))
	return cmd
}

// printFires prints a schedule's fires as a table.
func (a *app) printFires(fires []schedule.Fire) error {
	w := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "NOMINAL\tSUBMITTED\tTASK\tOUTCOME")
	for _, f := range fires {
		sub := "-"
		if !f.SubmittedAt.IsZero() {
			sub = f.SubmittedAt.UTC().Format(time.RFC3339Nano)
		}
		out := f.Outcome
		if f.Count > 0 {
			out = fmt.Sprintf("%s (%d ticks to %s)", out, f.Count, f.LastTime.UTC().Format(time.RFC3339))
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\n", f.NominalTime.UTC().Format(time.RFC3339), sub, f.TaskID, out)
	}
	return w.Flush()
}

// startSchedules runs the schedule runner over cli until the returned
// stop is called: every drover server fires the ticks of the schedules of
// every namespace (those created over HTTP in another namespace too).
func (a *app) startSchedules(ctx context.Context, cli *clientv3.Client) (stop func(), err error) {
	c, err := schedule.New(schedule.Config{Etcd: cli, Namespace: a.namespace})
	if err != nil {
		return nil, err
	}
	r := &schedule.Runner{Client: c, AllNamespaces: true, Logger: a.logger}
	r.Start(ctx)
	crons := &agentserver.CronRunner{Etcd: cli, Logger: a.logger} // the Agent Server's crons fire through schedules
	crons.Start(ctx)
	return func() { crons.Stop(); r.Stop() }, nil
}

// startServing starts what a server serves over cli: the HTTP API (with
// --http-listen), the schedules' runner and the budgets' gauges (served
// with --metrics-listen). stop stops the runner, then the API; it is safe
// to call twice.
func (a *app) startServing(ctx context.Context, h *httpFlags, cli *clientv3.Client) (stop func(), err error) {
	stopHTTP, err := a.startHTTP(h, cli)
	if err != nil {
		return nil, err
	}
	stopSchedules, err := a.startSchedules(ctx, cli)
	if err != nil {
		stopHTTP()
		return nil, err
	}
	unregister := a.registerBudgetMetrics(cli)
	return func() { stopSchedules(); stopHTTP(); unregister() }, nil
}
