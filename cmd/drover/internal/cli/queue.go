package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/process"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	"github.com/spf13/cobra"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// ExitRejected is the exit code of a submission in which some lines were
// rejected (EX_DATAERR); the valid ones were submitted.
const ExitRejected = 65

// submitChunk is how many JSONL lines are read before they are submitted.
const submitChunk = 20000

func (a *app) submitCommand() *cobra.Command {
	var (
		q, file, typ, id string
		params           []string
		priority         int
		maxRetries       int
		timeout          time.Duration
		asJSON           bool
	)
	cmd := &cobra.Command{
		Use:   "submit --queue Q (--file tasks.jsonl | --type T [--param k=v ...])",
		Short: "Submit tasks to a queue: a JSONL file (one task per line) or one task from flags",
		Long: `Submit tasks to queue Q.

With --file, each line is a task as a JSON object: task_id, task_type,
input_data_uri, output_data_uri, parameters, metadata {priority, source_system,
tenant}, max_retries, timeout, backoff_base, backoff_max. "-" reads standard
input. Lines are submitted in batched transactions. Submitting is idempotent on
task_id, which is unique across queues: the same task again is counted as a
duplicate and left alone, so a file can be submitted again safely; the same
task_id with another queue, type or content is rejected. Lines that are not
valid tasks are reported with their line number while every valid line is
submitted; the exit code is 65 when any line was rejected. Input that is
plainly not JSONL (a NUL byte, a line of over 1 MiB without a newline, more
than 1,000 rejected lines) stops the submission, exit 65.

With --type, one task is submitted from flags; --param k=v may repeat (v is
read as JSON when it parses, else as a string).`,
		Example: `  drover submit --queue emails --file tasks.jsonl
  cat tasks.jsonl | drover submit --queue emails --file - --json
  drover submit --queue emails --type summarize --param thread=4411 --param max_words=200`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			if err := drover.Rename(queue.CheckQueue(q), "--queue"); err != nil {
				return err
			}
			if (file == "") == (typ == "") {
				return usageError{errors.New("give either --file or --type (see 'drover submit --help')")}
			}
			var one *queue.Task
			if typ != "" {
				t, err := taskFromFlags(cmd, id, typ, params, priority, maxRetries, timeout)
				if err != nil {
					return err
				}
				if err := t.Validate(); err != nil {
					return renameTaskField(err)
				}
				one = &t
			}
			if file != "" && file != "-" {
				if err := checkInputFile(file); err != nil {
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
				res, err = c.Submit(cmd.Context(), q, []queue.Task{*one}, nil)
			} else {
				res, err = a.submitFile(cmd.Context(), c, q, file)
			}
			if errors.Is(err, queue.ErrQueueFull) {
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
		},
	}
	f := cmd.Flags()
	f.StringVar(&q, "queue", "", "queue name (required)")
	f.StringVar(&file, "file", "", "JSONL file of tasks, - for standard input")
	f.StringVar(&typ, "type", "", "task type of a single task")
	f.StringVar(&id, "id", "", "task id of a single task (default: random)")
	f.StringArrayVar(&params, "param", nil, "parameter of a single task as k=v (repeat)")
	f.IntVar(&priority, "priority", 0, "priority of a single task (0-1000, higher first)")
	f.IntVar(&maxRetries, "max-retries", queue.DefaultMaxRetries, "retry budget of a single task")
	f.DurationVar(&timeout, "timeout", 0, "timeout of one attempt of a single task (default: the worker's)")
	f.BoolVar(&asJSON, "json", false, `print {"submitted":N,"duplicates":N,"rejected":[{"line":N,"error":"..."}]}`)
	return cmd
}

// renameTaskField names the flag that set a task's field in an input error.
func renameTaskField(err error) error {
	var ie *drover.InputError
	if !errors.As(err, &ie) {
		return err
	}
	flags := map[string]string{"task_id": "--id", "task_type": "--type", "metadata.priority": "--priority",
		"max_retries": "--max-retries", "timeout/backoff": "--timeout", "parameters": "--param"}
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

// submitFile streams a JSONL file into the queue in chunks, with progress.
func (a *app) submitFile(ctx context.Context, sub *queue.Client, q, file string) (queue.SubmitResult, error) {
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
	prog := newProgress(a.stderr, "submit", size)
	defer prog.done()
	// The next chunk is read and parsed while this one is submitted.
	rctx, stopReading := context.WithCancel(ctx)
	defer stopReading()
	chunks := make(chan lineChunk, 1)
	go func() {
		defer close(chunks)
		lr := &lineReader{r: bufio.NewReaderSize(in, 1<<20)}
		for {
			c := lr.chunk()
			select {
			case chunks <- c:
			case <-rctx.Done():
				return
			}
			if c.eof || c.stop != nil {
				return
			}
		}
	}()
	for c := range chunks {
		total.Rejected = append(total.Rejected, c.rejected...)
		if len(c.batch) > 0 {
			res, err := sub.Submit(ctx, q, c.batch, nil)
			total.Submitted += res.Submitted
			total.Duplicates += res.Duplicates
			for _, rj := range res.Rejected {
				total.Rejected = append(total.Rejected, queue.LineError{Line: c.lines[rj.Line-1], Error: rj.Error})
			}
			if err != nil {
				return total, err
			}
		}
		prog.update(c.read, total.Submitted+total.Duplicates)
		if c.stop != nil {
			queue.SortLineErrors(total.Rejected)
			return total, withCode(ExitRejected, fmt.Errorf("%w; stopped there: submitted %d, duplicates %d, rejected %d before it. Fix the input and submit it again: lines already in count as duplicates",
				c.stop, total.Submitted, total.Duplicates, len(total.Rejected)))
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

// Bounds on input that is plainly not JSONL, so that a wrong file (a binary,
// /dev/urandom, /dev/zero) stops at once instead of filling memory or
// running forever.
const (
	// maxRejectedLines: more rejected lines than this stop the submission.
	maxRejectedLines = 1000
	// maxLineScan: a line this long with no newline stops the submission.
	maxLineScan = 1 << 20
)

// errNotJSONL stops a submission whose input is not JSONL text.
var errNotJSONL = errors.New("the input is not JSONL")

// lineReader reads a JSONL submission line by line.
type lineReader struct {
	r        *bufio.Reader
	lineNo   int
	read     int64
	rejected int // lines rejected so far
}

// lineChunk is a chunk of a JSONL submission: up to submitChunk valid tasks
// (and at most submitChunkBytes of them) with their line numbers, the lines
// rejected among them, how many bytes were read by its end, whether the
// input ended, and why the submission must stop, if it must.
type lineChunk struct {
	batch    []queue.Task
	lines    []int
	rejected []queue.LineError
	read     int64
	eof      bool
	stop     error
}

// submitChunkBytes bounds the bytes of lines a chunk holds.
const submitChunkBytes = 32 << 20

// chunk reads the next chunk.
func (lr *lineReader) chunk() (c lineChunk) {
	defer func() { c.read = lr.read }()
	size := 0
	reject := func(e queue.LineError) {
		c.rejected = append(c.rejected, e)
		lr.rejected++
	}
	for len(c.batch) < submitChunk && size < submitChunkBytes {
		line, err := readLine(lr.r, queue.MaxPayload*2, maxLineScan)
		lr.read += int64(line.n)
		size += line.n
		if err == io.EOF && line.n == 0 {
			c.eof = true
			return c
		}
		if err != nil && err != io.EOF {
			c.stop = fmt.Errorf("read line %d: %w", lr.lineNo+1, err)
			return c
		}
		lr.lineNo++
		if lr.lineNo == 1 {
			line.text = bytes.TrimPrefix(line.text, []byte("\xef\xbb\xbf")) // a UTF-8 byte order mark
		}
		switch {
		case line.endless:
			c.stop = fmt.Errorf("%w: line %d runs past %d MiB without a newline", errNotJSONL, lr.lineNo, maxLineScan>>20)
			return c
		case bytes.IndexByte(line.text, 0) >= 0:
			c.stop = fmt.Errorf("%w: line %d holds a NUL byte", errNotJSONL, lr.lineNo)
			return c
		case line.tooLong:
			reject(queue.LineError{Line: lr.lineNo, Error: fmt.Sprintf("line longer than %d bytes: put large inputs behind input_data_uri", queue.MaxPayload*2)})
		case len(bytes.TrimSpace(line.text)) == 0:
			// blank lines are skipped
		default:
			t, perr := queue.ParseLine(line.text)
			if perr != nil {
				reject(queue.LineError{Line: lr.lineNo, Error: perr.Error()})
			} else {
				c.batch = append(c.batch, t)
				c.lines = append(c.lines, lr.lineNo)
			}
		}
		if lr.rejected > maxRejectedLines {
			c.stop = fmt.Errorf("%w: more than %d lines rejected", errNotJSONL, maxRejectedLines)
			return c
		}
		if err == io.EOF {
			c.eof = true
			return c
		}
	}
	return c
}

type lineRead struct {
	text    []byte
	n       int  // bytes read, newline included
	tooLong bool // longer than max: text is nil
	endless bool // longer than scan without a newline: the rest is unread
}

// readLine reads one line of at most max bytes; a longer line is consumed
// (up to scan bytes) and reported as too long; a line with no newline in its
// first scan bytes is reported as endless.
func readLine(r *bufio.Reader, max, scan int) (lineRead, error) {
	var out lineRead
	for {
		chunk, err := r.ReadSlice('\n')
		out.n += len(chunk)
		if len(out.text)+len(chunk) > max {
			out.tooLong = true
			out.text = nil
		} else if !out.tooLong {
			out.text = append(out.text, chunk...)
		}
		if err == bufio.ErrBufferFull {
			if out.n > scan {
				out.endless, out.text = true, nil
				return out, nil
			}
			continue
		}
		out.text = bytes.TrimRight(out.text, "\r\n")
		return out, err
	}
}

// progress shows how far a long operation got: a bar on a terminal, a plain
// line every few seconds otherwise.
type progress struct {
	w     io.Writer
	what  string
	size  int64
	tty   bool
	start time.Time
	last  time.Time
}

func newProgress(w io.Writer, what string, size int64) *progress {
	return &progress{w: w, what: what, size: size, tty: isTerminal(w), start: time.Now()}
}

func (p *progress) update(bytes int64, items int) {
	now := time.Now()
	if p.tty {
		if now.Sub(p.last) < 100*time.Millisecond {
			return
		}
		p.last = now
		bar := ""
		if p.size > 0 {
			frac := min(float64(bytes)/float64(p.size), 1)
			n := int(frac * 30)
			bar = fmt.Sprintf("[%s%s] %3.0f%% ", strings.Repeat("=", n), strings.Repeat(" ", 30-n), frac*100)
		}
		fmt.Fprintf(p.w, "\r%s: %s%d tasks, %.0f/s ", p.what, bar, items, float64(items)/now.Sub(p.start).Seconds())
		return
	}
	if now.Sub(p.last) < 5*time.Second {
		return
	}
	p.last = now
	fmt.Fprintf(p.w, "%s: %d tasks so far (%.0f/s)\n", p.what, items, float64(items)/now.Sub(p.start).Seconds())
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprintln(p.w)
	}
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// registryRefresh is how often a worker refreshes its load in the registry.
const registryRefresh = 2 * time.Second

func (a *app) workerCommand() *cobra.Command {
	var (
		cfg       queue.WorkerConfig
		handler   string
		maxOutput int
		grace     time.Duration
		asJSON    bool

		metricsListen string
		depthInterval time.Duration
		limitFlags    []string
		quotaFlags    []string
		breakerFlags  []string
	)
	cmd := &cobra.Command{
		Use:   "worker --queue Q --handler 'exec:CMD ARGS' [flags]",
		Short: "Claim and run a queue's tasks, each in its own process",
		Long: `Claim tasks of queue Q in batches (up to --prefetch per transaction), bound
to this worker's lease and fenced, and run up to --concurrency at once. While
tasks take less than 5 ms on average, up to --prefetch more are claimed ahead
of a free slot, so that claiming overlaps the work.

--handler 'exec:CMD ARGS' runs CMD ARGS with sh for each task, in a process
of its own: the task as JSON on standard input, standard output (at most
--max-output bytes) as the result. Exit 0 is success; exit 65 (EX_DATAERR)
is a permanent failure (straight to the dead-letter queue); any other exit,
a signal or a timeout is transient (retried with backoff). The process is
killed when the task times out, is cancelled, or the claim is lost.
--handler noop succeeds at once (benchmarks, tests).

If this worker dies, its claims end with its lease (--ttl) and other workers
take its tasks. Idle workers wait on a watch. SIGINT/SIGTERM stop claiming,
let running tasks finish for --shutdown-timeout, then hand the rest back.
--drain exits 0 once the queue has nothing pending, running or retrying.

The worker registers itself in the registry (component "worker", id
--worker-id) with its queue and in-flight count, refreshed every 2 s, under
the same lease as its claims: "drover workers" lists it while it lives. If
the lease is lost, it stops and exits 70.`,
		Example: `  drover worker --queue emails --concurrency 16 --handler 'exec:python3 summarize.py'
  drover worker --queue emails --handler 'exec:./agent --model small' --drain --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			cfg.Namespace, cfg.Logger = a.namespace, a.logger
			if err := cfg.Validate(); err != nil {
				var ie *drover.InputError
				if errors.As(err, &ie) {
					return ie.Renamed("--" + strings.ReplaceAll(ie.Field, " ", "-"))
				}
				return err
			}
			if cfg.Concurrency == 0 {
				return &drover.InputError{Field: "--concurrency", Value: 0, Rule: "must be between 1 and 10000"}
			}
			if err := checkWorkerFlags(cfg, maxOutput, grace, depthInterval); err != nil {
				return err
			}
			spec, err := flow.ParseSpec(limitFlags, quotaFlags, breakerFlags)
			if err != nil {
				return err
			}
			var h queue.Handler
			switch {
			case handler == "noop":
				h = func(ctx context.Context, t *queue.Task) ([]byte, error) { return nil, nil }
			case strings.HasPrefix(handler, "exec:") && strings.TrimSpace(strings.TrimPrefix(handler, "exec:")) != "":
				h = queue.ExecHandler([]string{"sh", "-c", strings.TrimPrefix(handler, "exec:")}, maxOutput, grace, os.Stderr)
			default:
				return &drover.InputError{Field: "--handler", Value: handler, Rule: "must be 'exec:CMD ARGS' or noop"}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			stopMetrics, err := a.serveMetrics(ctx, metricsListen)
			if err != nil {
				return err
			}
			defer stopMetrics()
			if metricsListen != "" {
				cfg.DepthInterval = depthInterval
			}
			cli, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer cli.Close()
			// The worker's claims and its registry entry share the
			// process's primary lease: both end together when it dies.
			rt, err := process.Start(ctx, cli, process.WithTTL(cfg.TTL), process.WithNamespace(a.namespace), process.WithLogger(a.logger))
			if err != nil {
				return err
			}
			defer shutdown(rt)
			cfg.Lease = rt.Lease()
			gates, closeGates, err := spec.Gates(ctx, cli, a.namespace, func() clientv3.LeaseID { return rt.Lease().ID() },
				flow.WithLimiterLogger(a.logger))
			if err != nil {
				return err
			}
			defer closeGates(context.Background())
			cfg.Gates = append(gates, cfg.Gates...)
			w, err := queue.NewWorker(ctx, cli, cfg)
			if err != nil {
				return err
			}
			defer func() {
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				_ = w.Close(cctx)
			}()
			if err := registry.RegisterWorker(ctx, rt, w, cfg, registryRefresh); err != nil {
				if errors.Is(err, registry.ErrDuplicate) {
					if cfg.WorkerID != "" {
						err = fmt.Errorf("%w (another worker runs with --worker-id %s)", err, w.ID())
					}
					return withCode(ExitUsage, err)
				}
				return err
			}
			w.HandleAll(h)
			a.logger.Info("worker started", "queue", cfg.Queue, "worker", w.ID(), "concurrency", cfg.Concurrency, "drain", cfg.Drain)
			runErr := w.Run(ctx)
			if errors.Is(runErr, lease.ErrLost) {
				runErr = withCode(ExitLeaseLost, fmt.Errorf("worker %s stopped: %w; its tasks are claimable by other workers", w.ID(), runErr))
			}
			st := w.Stats()
			if asJSON {
				_ = json.NewEncoder(a.stdout).Encode(st)
			} else {
				a.logger.Info("worker stopped", "claimed", st.Claimed, "succeeded", st.Succeeded, "retried", st.Retried,
					"dead", st.Dead, "handed_back", st.HandedBack, "fenced", st.Fenced)
			}
			return runErr
		},
	}
	f := cmd.Flags()
	f.StringVar(&cfg.Queue, "queue", "", "queue name (required)")
	f.StringVar(&cfg.WorkerID, "worker-id", "", "worker id (default host:pid)")
	f.IntVar(&cfg.Concurrency, "concurrency", 8, "tasks run at once")
	f.IntVar(&cfg.Prefetch, "prefetch", 0, "most tasks claimed per transaction (default --concurrency, at most 100)")
	f.StringVar(&handler, "handler", "", "'exec:CMD ARGS' or noop")
	f.DurationVar(&cfg.TTL, "ttl", 10*time.Second, "lease TTL: a dead worker's tasks are claimable again after about this long")
	f.DurationVar(&cfg.Timeout, "timeout", 30*time.Minute, "timeout of one attempt of a task that sets none")
	f.DurationVar(&cfg.BackoffBase, "backoff-base", time.Second, "first retry delay bound (full jitter, doubling)")
	f.DurationVar(&cfg.BackoffMax, "backoff-max", 5*time.Minute, "largest retry delay")
	f.BoolVar(&cfg.Drain, "drain", false, "exit 0 once the queue has nothing pending, running or retrying")
	f.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, time running tasks get to finish before they are handed back")
	f.DurationVar(&cfg.Retention, "retention", queue.DefaultRetention, "how long succeeded and cancelled tasks are kept (their counts stay); negative keeps them")
	f.IntVar(&maxOutput, "max-output", queue.DefaultMaxOutput, "largest result an exec handler may print, in bytes")
	f.DurationVar(&grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when a task's process is stopped")
	f.BoolVar(&asJSON, "json", false, "print the worker's counts as JSON when it stops")
	f.StringArrayVar(&limitFlags, "limit", nil, "fleet-wide rate limit 'NAME=RATE[;burst=N][;types=T1,T2]' (repeatable), e.g. openai=500/m; created in etcd if absent, else etcd's setting wins")
	f.StringArrayVar(&quotaFlags, "quota", nil, "fleet-wide concurrency quota 'NAME[:SUBJECT]=K[;types=T1,T2]' (repeatable): tenant=K per tenant, tenant:acme=2 for one tenant, type=K per task type, any other NAME a shared resource; over-quota tasks wait in the queue")
	f.StringArrayVar(&breakerFlags, "breaker", nil, "circuit breaker shared by the fleet 'NAME[;failures=5][;cooldown=30s][;ratio=0.5;window=1m;min-calls=20][;types=T1,T2]' (repeatable): open after N consecutive failures or a failure ratio over a window, defer tasks while open")
	f.StringVar(&metricsListen, "metrics-listen", "", "host:port to serve Prometheus metrics on (/metrics), e.g. 127.0.0.1:9090")
	f.DurationVar(&depthInterval, "depth-interval", 10*time.Second, "with --metrics-listen: how often the queue's tasks are counted by state")
	return cmd
}

// checkWorkerFlags refuses worker flags that the library would read as
// "the default" (a zero duration) or that make no sense, so that a typo does
// not pass silently.
func checkWorkerFlags(cfg queue.WorkerConfig, maxOutput int, grace, depthInterval time.Duration) error {
	if maxOutput < 1 || maxOutput > queue.MaxResult {
		return &drover.InputError{Field: "--max-output", Value: maxOutput, Rule: fmt.Sprintf("must be between 1 and %d bytes", queue.MaxResult)}
	}
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--timeout", cfg.Timeout}, {"--grace", grace}, {"--backoff-base", cfg.BackoffBase}, {"--backoff-max", cfg.BackoffMax},
		{"--shutdown-timeout", cfg.ShutdownTimeout}, {"--depth-interval", depthInterval}} {
		if d.v <= 0 {
			return &drover.InputError{Field: d.flag, Value: d.v, Rule: "must be positive"}
		}
	}
	if cfg.BackoffMax < cfg.BackoffBase {
		return &drover.InputError{Field: "--backoff-max", Value: cfg.BackoffMax, Rule: "must be at least --backoff-base"}
	}
	return nil
}
