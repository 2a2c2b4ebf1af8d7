package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/droverhq/drover/budget"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/childview"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/task"
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

// printPage prints a page of a listing: JSON {"tasks": [...], "next":
// CURSOR} with --json, else a table, and the command for the next page on
// stderr when there is one.
func (a *app) printPage(page queue.Page, asJSON bool, again string) error {
	if asJSON {
		views := make([]queue.View, len(page.Tasks))
		for i, t := range page.Tasks {
			views[i] = queue.NewView(t)
		}
		return json.NewEncoder(a.stdout).Encode(struct {
			Tasks []queue.View `json:"tasks"`
			Next  string       `json:"next,omitempty"`
		}{views, page.Next})
	}
	if len(page.Tasks) == 0 {
		fmt.Fprintln(a.stdout, "no tasks")
		return nil
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TASK\tTYPE\tSTATUS\tATTEMPT\tRETRIES\tCREATED\tLAST ERROR")
	for _, t := range page.Tasks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d/%d\t%s\t%s\n", t.ID, t.Type, t.CurrentStatus, t.Attempt, t.RetriesAttempted, t.Retries(),
			t.Metadata.CreatedAt.Format(time.RFC3339), firstLine(t.LastError, 60))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(a.stderr, "more: %s --after %s\n", again, page.Next)
	}
	return nil
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
		return json.NewEncoder(a.stdout).Encode(queue.NewView(t))
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
	if !t.ScheduledAt.IsZero() && t.CurrentStatus == queue.Sleeping {
		fmt.Fprintf(tw, "sleeps until:\t%s\n", t.ScheduledAt.Format(time.RFC3339Nano))
	}
	if !t.ScheduledAt.IsZero() && t.CurrentStatus == queue.Scheduled {
		fmt.Fprintf(tw, "runs at:\t%s\n", t.ScheduledAt.Format(time.RFC3339Nano))
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

// family is what `tasks get` shows beside a task: its signals, its
// parent's queue and a page of its children.
type family struct {
	signals     []task.SignalRecord
	parentQueue string
	children    childview.Page
}

// getTaskFamily validates id, connects once and reads the task, its
// signals, its parent's queue and a page of its children (limit of them
// from cursor).
func (a *app) getTaskFamily(ctx context.Context, id, cursor string, limit int) (*queue.Task, family, error) {
	var f family
	if err := checkTaskIDs([]string{id}); err != nil {
		return nil, f, err
	}
	if limit < 1 || limit > childview.MaxLimit {
		return nil, f, usageError{&drover.InputError{Field: "--children", Value: fmt.Sprint(limit), Rule: fmt.Sprintf("must be 1 to %d", childview.MaxLimit)}}
	}
	if _, err := childview.ParseCursor(cursor); err != nil {
		return nil, f, usageError{drover.Rename(err, "--children-after")}
	}
	if err := a.checkGlobal(); err != nil {
		return nil, f, err
	}
	cli, err := a.connect(ctx)
	if err != nil {
		return nil, f, err
	}
	defer cli.Close()
	c, err := queue.NewClient(cli, a.namespace)
	if err != nil {
		return nil, f, err
	}
	t, err := c.Get(ctx, id)
	if err != nil {
		return nil, f, err
	}
	if f.signals, err = c.Signals(ctx, id); err != nil {
		return nil, f, err
	}
	if t.Parent != "" {
		switch p, err := c.Get(ctx, t.Parent); {
		case err == nil:
			f.parentQueue = p.Queue
		case !errors.Is(err, queue.ErrNotFound):
			return nil, f, err
		}
	}
	f.children, err = childview.Read(ctx, childview.Source{Etcd: cli, Namespace: a.namespace}, id, cursor, limit)
	if err != nil {
		return nil, f, drover.Rename(err, "--children-after")
	}
	return t, f, nil
}

// globalFlags is "drover " and the global flags given that say where the
// command read, for a command printed to run next.
func (a *app) globalFlags() string {
	out := "drover "
	if a.endpoints != "" {
		out += "--etcd-endpoints " + a.endpoints + " "
	}
	if a.namespace != keyspace.DefaultNamespace {
		out += "--namespace " + a.namespace + " "
	}
	return out
}

// familyView is `tasks get --json`: the task's view with its parent's
// queue and its children.
type familyView struct {
	queue.View
	BudgetWait  *budget.Wait    `json:"budget_wait,omitempty"`
	ParentQueue string          `json:"parent_queue,omitempty"`
	Children    *childrenOutput `json:"children,omitempty"`
}

// childrenOutput is a page of children as --json prints it (the HTTP
// API's form).
type childrenOutput struct {
	Spawned    int64             `json:"spawned"`
	Succeeded  int64             `json:"succeeded"`
	Failed     int64             `json:"failed"`
	Live       int64             `json:"live"`
	Steps      []childview.Step  `json:"steps"`
	Children   []childview.Child `json:"children"`
	NextCursor string            `json:"next_cursor,omitempty"`
}

// printTaskFamily prints a task with what it waits for, its signals, its
// parent and its children.
func (a *app) printTaskFamily(t *queue.Task, f family, again string, asJSON bool) error {
	if asJSON {
		v := familyView{View: queue.NewView(t), BudgetWait: budget.TaskWait(t), ParentQueue: f.parentQueue}
		v.Signals = f.signals
		if p := f.children; len(p.Steps) > 0 {
			v.Children = &childrenOutput{Spawned: p.Spawned, Succeeded: p.Succeeded, Failed: p.Failed, Live: p.Live,
				Steps: p.Steps, Children: p.Children, NextCursor: p.Next}
		}
		return json.NewEncoder(a.stdout).Encode(v)
	}
	if err := a.printTaskSignals(t, f.signals, false); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(a.stdout, 0, 4, 2, ' ', 0)
	if w := budget.TaskWait(t); w != nil {
		fmt.Fprintf(tw, "waits for:\tbudget %s, since %s (%d deferrals, attempt not counted)\n", w.Budget, w.Since.Format(time.RFC3339), w.Deferrals)
	}
	if t.Parent != "" {
		where := "gone"
		if f.parentQueue != "" {
			where = "queue " + f.parentQueue
		}
		fmt.Fprintf(tw, "parent:\t%s (step %d, %s)\n", t.Parent, t.ParentStep, where)
	}
	p := f.children
	if len(p.Steps) > 0 {
		fmt.Fprintf(tw, "children:\t%d spawned: %d succeeded, %d failed (dead or cancelled), %d not ended\n", p.Spawned, p.Succeeded, p.Failed, p.Live)
		for _, s := range p.Steps {
			fmt.Fprintf(tw, "  step %d\t%d spawned\t%d succeeded\t%d failed\t%d not ended\n", s.Step, s.Spawned, s.Succeeded, s.Failed, s.Live)
		}
		for _, c := range p.Children {
			fmt.Fprintf(tw, "  %s\t%s\t%s\tstep %d\t%s\n", c.ID, c.Queue, c.Status, c.Step, firstLine(c.Error, 60))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if p.Next != "" {
		fmt.Fprintf(a.stderr, "more children: %s --children-after %s\n", again, p.Next)
	}
	return nil
}
