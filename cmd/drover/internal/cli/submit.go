package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cmd/drover/internal/jsonl"
	"github.com/droverhq/drover/cmd/drover/internal/progress"
	"github.com/droverhq/drover/queue"
	"github.com/spf13/cobra"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
)

// ExitRejected is the exit code of a submission in which some lines were
// rejected (EX_DATAERR); the valid ones were submitted.
const ExitRejected = 65

// submitFlags are drover submit's flags.
type submitFlags struct {
	q, file, typ, id string
	params           []string
	priority         int
	maxRetries       int
	timeout          time.Duration
	asJSON           bool
	in               time.Duration // --in: run after this long
	at               string        // --at: run at this time (RFC 3339)
}

// due returns what --in or --at sets on each task (nil: neither was
// given): a task that gives its own run_at or delay keeps it.
func (sf *submitFlags) due(cmd *cobra.Command) (func(*queue.Task), error) {
	inSet, atSet := cmd.Flags().Changed("in"), cmd.Flags().Changed("at")
	switch {
	case inSet && atSet:
		return nil, usageError{errors.New("give --in or --at, not both")}
	case inSet && sf.in < 0:
		return nil, &drover.InputError{Field: "--in", Value: sf.in.String(), Rule: "must not be negative"}
	case inSet:
		d := queue.Duration(sf.in)
		return func(t *queue.Task) {
			if t.RunAt.IsZero() && t.Delay == 0 {
				t.Delay = d
			}
		}, nil
	case atSet:
		at, err := time.Parse(time.RFC3339Nano, sf.at)
		if err != nil {
			return nil, &drover.InputError{Field: "--at", Value: sf.at, Rule: "must be an RFC 3339 time such as 2026-12-01T09:00:00Z"}
		}
		return func(t *queue.Task) {
			if t.RunAt.IsZero() && t.Delay == 0 {
				t.RunAt = at
			}
		}, nil
	}
	return nil, nil
}

func (a *app) submitCommand() *cobra.Command {
	var sf submitFlags
	cmd := &cobra.Command{
		Use:   "submit --queue Q (--file tasks.jsonl | --type T [--param k=v ...])",
		Short: "Submit tasks to a queue: a JSONL file (one task per line) or one task from flags",
		Long: `Submit tasks to queue Q.

With --file, each line is a task as a JSON object: task_id, task_type,
input_data_uri, output_data_uri, parameters, metadata {priority, source_system,
tenant, budget, estimated_tokens}, max_retries, timeout, backoff_base, backoff_max, and run_at (RFC 3339)
or delay ("10m") to run it later: until then it is SCHEDULED. "-" reads standard
input. Lines are submitted in batched transactions. Submitting is idempotent on
task_id, which is unique across queues: the same task again is counted as a
duplicate and left alone, so a file can be submitted again safely; the same
task_id with another queue, type or content is rejected. Lines that are not
valid tasks are reported with their line number while every valid line is
submitted; the exit code is 65 when any line was rejected. Input that is
plainly not JSONL (a NUL byte, a line of over 1 MiB without a newline, more
than 1,000 rejected lines) stops the submission, exit 65.

With --type, one task is submitted from flags; --param k=v may repeat (v is
read as JSON when it parses, else as a string).

--in 10m or --at 2026-12-01T09:00:00Z runs the tasks later (every line of a
file that gives neither run_at nor delay): they are SCHEDULED until then and
no worker claims them before. A time in the past means now.`,
		Example: `  drover submit --queue emails --file tasks.jsonl
  cat tasks.jsonl | drover submit --queue emails --file - --json
  drover submit --queue emails --type summarize --param thread=4411 --param max_words=200
  drover submit --queue builds --type check --param build=981 --in 10m
  drover submit --queue reminders --file tomorrow.jsonl --at 2026-12-01T09:00:00Z`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return a.runSubmit(cmd, &sf) },
	}
	f := cmd.Flags()
	f.StringVar(&sf.q, "queue", "", "queue name (required)")
	f.StringVar(&sf.file, "file", "", "JSONL file of tasks, - for standard input")
	f.StringVar(&sf.typ, "type", "", "task type of a single task")
	f.StringVar(&sf.id, "id", "", "task id of a single task (default: random)")
	f.StringArrayVar(&sf.params, "param", nil, "parameter of a single task as k=v (repeat)")
	f.IntVar(&sf.priority, "priority", 0, "priority of a single task (0-1000, higher first)")
	f.IntVar(&sf.maxRetries, "max-retries", queue.DefaultMaxRetries, "retry budget of a single task")
	f.DurationVar(&sf.timeout, "timeout", 0, "timeout of one attempt of a single task (default: the worker's)")
	f.DurationVar(&sf.in, "in", 0, "run the tasks after this long (10m, 2h): SCHEDULED until then")
	f.StringVar(&sf.at, "at", "", "run the tasks at this RFC 3339 time (2026-12-01T09:00:00Z): SCHEDULED until then")
	f.BoolVar(&sf.asJSON, "json", false, `print {"submitted":N,"duplicates":N,"rejected":[{"line":N,"error":"..."}]}`)
	return cmd
}

// runSubmit checks the flags, submits the file or the one task, and reports
// what went in.
func (a *app) runSubmit(cmd *cobra.Command, sf *submitFlags) error {
	if err := a.checkGlobal(); err != nil {
		return err
	}
	if err := drover.Rename(queue.CheckQueue(sf.q), "--queue"); err != nil {
		return err
	}
	if (sf.file == "") == (sf.typ == "") {
		return usageError{errors.New("give either --file or --type (see 'drover submit --help')")}
	}
	due, err := sf.due(cmd)
	if err != nil {
		return err
	}
	var one *queue.Task
	if sf.typ != "" {
		t, err := taskFromFlags(cmd, sf.id, sf.typ, sf.params, sf.priority, sf.maxRetries, sf.timeout)
		if err != nil {
			return err
		}
		if due != nil {
			due(&t)
		}
		if err := t.Validate(); err != nil {
			return renameTaskField(err)
		}
		one = &t
	}
	if sf.file != "" && sf.file != "-" {
		if err := checkInputFile(sf.file); err != nil {
			return err
		}
	}
	cli, err := a.connect(cmd.Context())
	if err != nil {
		return err
	}
	defer cli.Close()
	c, err := queue.NewClient(cli, a.namespace)
	if err != nil {
		return err
	}
	var res queue.SubmitResult
	if one != nil {
		res, err = c.Submit(cmd.Context(), sf.q, []queue.Task{*one}, nil)
	} else {
		res, err = a.submitFile(cmd.Context(), c, sf.q, sf.file, due)
	}
	return a.reportSubmit(res, err, sf.asJSON)
}

// reportSubmit prints what a submission did and returns its error, with the
// exit code that says how it ended.
func (a *app) reportSubmit(res queue.SubmitResult, err error, asJSON bool) error {
	err = storeFull(err)
	if errors.Is(err, queue.ErrQueueFull) || errors.Is(err, drover.ErrStoreFull) {
		// Report what went in, then fail fast: try again later.
		if asJSON {
			_ = json.NewEncoder(a.stdout).Encode(res)
		} else {
			fmt.Fprintf(a.stdout, "submitted %d, duplicates %d, rejected %d\n", res.Submitted, res.Duplicates, len(res.Rejected))
		}
		return withCode(ExitBusy, err)
	}
	if err != nil {
		return err
	}
	if asJSON {
		if err := json.NewEncoder(a.stdout).Encode(res); err != nil {
			return err
		}
	} else {
		fmt.Fprintf(a.stdout, "submitted %d, duplicates %d, rejected %d\n", res.Submitted, res.Duplicates, len(res.Rejected))
		for _, r := range res.Rejected {
			fmt.Fprintf(a.stderr, "line %d: %s\n", r.Line, r.Error)
		}
	}
	if len(res.Rejected) > 0 {
		return withCode(ExitRejected, fmt.Errorf("%d lines rejected; every valid line was submitted", len(res.Rejected)))
	}
	return nil
}

// errNoSpace is the store-full error of a write etcd itself refused.
type errNoSpace struct{ err error }

func (e errNoSpace) Error() string {
	return "store full: etcd refused the write with its NOSPACE alarm (" + e.err.Error() + "): every write that adds data is refused until space is freed, " +
		"lease grants and locks included; free space with `drover tasks purge --queue Q --status SUCCEEDED --all` (or `drover dlq purge --queue Q --all`): " +
		"`drover server`'s store guard then compacts, defragments and disarms the alarm; submitting again is safe"
}

// Unwrap returns drover.ErrStoreFull and etcd's error.
func (e errNoSpace) Unwrap() []error { return []error{drover.ErrStoreFull, e.err} }

// storeFull makes etcd's own NOSPACE refusal a store-full error (exit
// 75, as the guard's refusal is), whatever the writer met first.
func storeFull(err error) error {
	if err != nil && !errors.Is(err, drover.ErrStoreFull) && errors.Is(err, rpctypes.ErrNoSpace) {
		return errNoSpace{err}
	}
	return err
}

// renameTaskField names the flag that set a task's field in an input error.
func renameTaskField(err error) error {
	var ie *drover.InputError
	if !errors.As(err, &ie) {
		return err
	}
	flags := map[string]string{"task_id": "--id", "task_type": "--type", "metadata.priority": "--priority",
		"max_retries": "--max-retries", "timeout/backoff": "--timeout", "parameters": "--param", "delay": "--in", "run_at": "--at"}
	if f, ok := flags[ie.Field]; ok {
		return ie.Renamed(f)
	}
	return err
}

func taskFromFlags(cmd *cobra.Command, id, typ string, params []string, priority, maxRetries int, timeout time.Duration) (queue.Task, error) {
	t := queue.Task{ID: id, Type: typ, Metadata: queue.Metadata{Priority: priority}, Timeout: queue.Duration(timeout)}
	if cmd.Flags().Changed("max-retries") {
		t.MaxRetries = &maxRetries
	}
	if len(params) > 0 {
		m := map[string]json.RawMessage{}
		for i, p := range params {
			k, v, ok := strings.Cut(p, "=")
			if !ok || k == "" {
				return t, &drover.InputError{Field: fmt.Sprintf("--param #%d", i+1), Value: p, Rule: "must be k=v"}
			}
			if json.Valid([]byte(v)) {
				m[k] = json.RawMessage(v)
			} else {
				b, _ := json.Marshal(v)
				m[k] = b
			}
		}
		t.Parameters, _ = json.Marshal(m)
	}
	return t, nil
}

// submitFile streams a JSONL file into the queue in chunks, with progress;
// due, if set, is applied to each task first.
func (a *app) submitFile(ctx context.Context, sub *queue.Client, q, file string, due func(*queue.Task)) (queue.SubmitResult, error) {
	var in io.Reader = a.stdin
	var size int64
	if file != "-" {
		f, err := os.Open(file)
		if err != nil {
			return queue.SubmitResult{}, fileError(file, err)
		}
		defer f.Close()
		if st, err := f.Stat(); err == nil {
			size = st.Size()
		}
		in = f
	}
	total := queue.SubmitResult{Rejected: []queue.LineError{}}
	prog := progress.New(a.stderr, "submit", size)
	defer prog.Done()
	// The next chunk is read and parsed while this one is submitted.
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	chunks := make(chan jsonl.Chunk, 1)
	go func() {
		defer close(chunks)
		lr := jsonl.NewReader(in)
		for {
			c := lr.Chunk()
			select {
			case chunks <- c:
			case <-rctx.Done():
				return
			}
			if c.EOF || c.Stop != nil {
				return
			}
		}
	}()
	for c := range chunks {
		total.Rejected = append(total.Rejected, c.Rejected...)
		if len(c.Batch) > 0 {
			for i := range c.Batch {
				if due != nil {
					due(&c.Batch[i])
				}
			}
			res, err := sub.Submit(ctx, q, c.Batch, nil)
			total.Submitted += res.Submitted
			total.Duplicates += res.Duplicates
			for _, rj := range res.Rejected {
				total.Rejected = append(total.Rejected, queue.LineError{Line: c.Lines[rj.Line-1], Error: rj.Error})
			}
			if err != nil {
				return total, err
			}
		}
		prog.Update(c.Read, total.Submitted+total.Duplicates)
		if c.Stop != nil {
			queue.SortLineErrors(total.Rejected)
			return total, withCode(ExitRejected, fmt.Errorf("%w; stopped there: submitted %d, duplicates %d, rejected %d before it. Fix the input and submit it again: lines already in count as duplicates",
				c.Stop, total.Submitted, total.Duplicates, len(total.Rejected)))
		}
	}
	queue.SortLineErrors(total.Rejected)
	return total, nil
}

// checkInputFile refuses a --file that cannot be read as a file, before
// anything is contacted.
func checkInputFile(file string) error {
	f, err := os.Open(file)
	if err != nil {
		return fileError(file, err)
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.IsDir() {
		return &drover.InputError{Field: "--file", Value: file, Rule: "is a directory: give a JSONL file, or - for standard input"}
	}
	return nil
}

// fileError says why --file could not be opened, once.
func fileError(file string, err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	return &drover.InputError{Field: "--file", Value: file, Rule: "must be a readable file: " + err.Error()}
}
