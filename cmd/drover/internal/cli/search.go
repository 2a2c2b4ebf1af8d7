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

// searchFlags are tasks search's flags.
type searchFlags struct {
	q, status, typ, prefix, since, until, cursor string
	params                                       []string
	limit                                        int
	asJSON                                       bool
}

// searchFlagOf names the flag of each field of queue.SearchQuery.
var searchFlagOf = map[string]string{"status": "--status", "type": "--type", "id_prefix": "--id-prefix", "param": "--param",
	"since": "--since", "until": "--until", "limit": "--limit", "cursor": "--cursor", "queue": "--queue"}

// searchFollow bounds how long tasks search goes on through pages that
// read their budget and found nothing, before it prints an empty one.
const searchFollow = 10 * time.Second

func (a *app) tasksSearchCommand() *cobra.Command {
	var f searchFlags
	cmd := &cobra.Command{
		Use:   "search --queue Q [--status S] [--type T] [--id-prefix P] [--param k=v] [--since T] [--until T]",
		Short: "Find a queue's tasks by status, type, id prefix, parameters and creation time",
		Long: `Finds the tasks of a queue that match every filter given, a page at a time.
--since and --until take a time (RFC 3339) or a duration back from now (1h,
90m); --param k=v matches the parameter k equal to v (v read as JSON when it
parses, else as a string) and may repeat.

An id prefix and a status are read from indexes; a type, parameters and
times are checked on the tasks read, a scan of up to 20,000 tasks a page
(see docs/queue.md, "Finding a task"). A page that found nothing yet is
followed by the next for up to 10 s. Without --json the command for the next
page is printed on stderr; with --json, give next_cursor back as --cursor
with the same filters (a cursor of another query is refused).

Exit codes: 0 found or not; 1 the queue does not exist; 2 bad input.`,
		Example: `  drover tasks search --queue emails --id-prefix r-42
  drover tasks search --queue emails --status DEAD --type summarize --since 1h
  drover tasks search --queue emails --param thread=4411 --json
  drover tasks search --queue emails --type render --since 2026-11-28T09:00:00Z --until 2026-11-28T10:00:00Z --limit 20`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return a.search(cmd.Context(), &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.q, "queue", "", "queue name")
	fl.StringVar(&f.status, "status", "", "only this status: SCHEDULED, PENDING, RUNNING, RETRYING, SUCCEEDED, DEAD or CANCELLED")
	fl.StringVar(&f.typ, "type", "", "only this task type")
	fl.StringVar(&f.prefix, "id-prefix", "", "only ids that start with this")
	fl.StringArrayVar(&f.params, "param", nil, "only tasks whose parameter k is v, as k=v (repeat: all must hold)")
	fl.StringVar(&f.since, "since", "", "only tasks created at or after this: RFC 3339 or a duration back from now (1h)")
	fl.StringVar(&f.until, "until", "", "only tasks created before this: RFC 3339 or a duration back from now")
	fl.IntVar(&f.limit, "limit", queue.DefaultListLimit, fmt.Sprintf("most tasks on the page (1 to %d)", queue.MaxListLimit))
	fl.StringVar(&f.cursor, "cursor", "", "continue the same search: the next_cursor of the page before")
	fl.BoolVar(&f.asJSON, "json", false, `print JSON: {"data": [...], "next_cursor": C, "scanned": N}, next_cursor absent once all was walked`)
	return cmd
}

// query is the search the flags ask for.
func (f *searchFlags) query() (queue.SearchQuery, error) {
	if f.limit < 1 || f.limit > queue.MaxListLimit {
		return queue.SearchQuery{}, &drover.InputError{Field: "--limit", Value: f.limit, Rule: fmt.Sprintf("must be between 1 and %d", queue.MaxListLimit)}
	}
	sq := queue.SearchQuery{Status: queue.Status(f.status), Type: f.typ, IDPrefix: f.prefix, Since: f.since, Until: f.until, Limit: f.limit, Cursor: f.cursor}
	for i, p := range f.params {
		k, v, ok := strings.Cut(p, "=")
		if !ok {
			return sq, &drover.InputError{Field: fmt.Sprintf("--param #%d", i+1), Value: p, Rule: "must be k=v"}
		}
		sq.Params = append(sq.Params, queue.ParamFilter{Key: k, Value: v})
	}
	return sq, nil
}

// search prints the first page of f's search that holds a task, or the
// page it reached after searchFollow.
func (a *app) search(ctx context.Context, f *searchFlags) error {
	sq, err := f.query()
	if err != nil {
		return err
	}
	c, done, err := a.queueFor(ctx, f.q)
	if err != nil {
		return err
	}
	defer done()
	start, scanned := time.Now(), 0
	var page queue.SearchPage
	for {
		if page, err = c.Search(ctx, f.q, sq); err != nil {
			var ie *drover.InputError
			if errors.As(err, &ie) && searchFlagOf[ie.Field] != "" {
				return drover.Rename(err, searchFlagOf[ie.Field])
			}
			return err
		}
		scanned += page.Scanned
		if len(page.Tasks) > 0 || page.Next == "" || time.Since(start) > searchFollow {
			break
		}
		sq.Cursor = page.Next
	}
	page.Scanned = scanned
	if f.asJSON {
		views := make([]queue.View, len(page.Tasks))
		for i, t := range page.Tasks {
			views[i] = queue.NewView(t)
		}
		return json.NewEncoder(a.stdout).Encode(struct {
			Data    []queue.View `json:"data"`
			Next    string       `json:"next_cursor,omitempty"`
			Scanned int          `json:"scanned"`
		}{views, page.Next, page.Scanned})
	}
	if err := a.printPage(queue.Page{Tasks: page.Tasks}, false, ""); err != nil {
		return err
	}
	if page.Next != "" {
		fmt.Fprintf(a.stderr, "more (%d tasks read): %s --cursor %s\n", page.Scanned, f.again(), page.Next)
	}
	return nil
}

// again is the command that searches as f does, for the next page.
func (f *searchFlags) again() string {
	args := []string{"drover", "tasks", "search", "--queue", f.q}
	add := func(flag, v string) {
		if v != "" {
			args = append(args, flag, shellWord(v))
		}
	}
	add("--status", f.status)
	add("--type", f.typ)
	add("--id-prefix", f.prefix)
	for _, p := range f.params {
		add("--param", p)
	}
	add("--since", f.since)
	add("--until", f.until)
	if f.limit != queue.DefaultListLimit {
		add("--limit", fmt.Sprint(f.limit))
	}
	return strings.Join(args, " ")
}

// shellWord quotes v for a POSIX shell when it needs it.
func shellWord(v string) string {
	if strings.Trim(v, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:=/+,@") == "" {
		return v
	}
	return "'" + strings.ReplaceAll(v, "'", `'\''`) + "'"
}
