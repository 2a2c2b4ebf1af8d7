package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/fleet"
	"github.com/droverhq/drover/flow"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/registry"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// workerFlags are drover worker's flags.
type workerFlags struct {
	cfg       queue.WorkerConfig
	handler   string
	maxOutput int
	grace     time.Duration
	asJSON    bool

	metricsListen string
	depthInterval time.Duration
	limits        []string
	quotas        []string
	breakers      []string
}

func (a *app) workerCommand() *cobra.Command {
	var f workerFlags
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
--drain exits 0 once the queue has nothing pending, running or retrying and
no scheduled task is due (it does not wait for tasks scheduled later).

The worker registers itself in the registry (component "worker", id
--worker-id) with its queue and in-flight count, refreshed every 2 s, under
the same lease as its claims: "drover workers" lists it while it lives. If
the lease is lost, it stops and exits 70.`,
		Example: `  drover worker --queue emails --concurrency 16 --handler 'exec:python3 summarize.py'
  drover worker --queue emails --handler 'exec:./agent --model small' --drain --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return a.runWorker(cmd.Context(), &f) },
	}
	f.bind(cmd.Flags())
	return cmd
}

// bind defines the flags on fs.
func (f *workerFlags) bind(fs *pflag.FlagSet) {
	fs.StringVar(&f.cfg.Queue, "queue", "", "queue name (required)")
	fs.StringVar(&f.cfg.WorkerID, "worker-id", "", "worker id (default host:pid)")
	fs.IntVar(&f.cfg.Concurrency, "concurrency", 8, "tasks run at once")
	fs.IntVar(&f.cfg.Prefetch, "prefetch", 0, "most tasks claimed per transaction (default --concurrency, at most 100)")
	fs.StringVar(&f.handler, "handler", "", "'exec:CMD ARGS' or noop")
	fs.DurationVar(&f.cfg.TTL, "ttl", 10*time.Second, "lease TTL: a dead worker's tasks are claimable again after about this long")
	fs.DurationVar(&f.cfg.Timeout, "timeout", 30*time.Minute, "timeout of one attempt of a task that sets none")
	fs.DurationVar(&f.cfg.BackoffBase, "backoff-base", time.Second, "first retry delay bound (full jitter, doubling)")
	fs.DurationVar(&f.cfg.BackoffMax, "backoff-max", 5*time.Minute, "largest retry delay")
	fs.BoolVar(&f.cfg.Drain, "drain", false, "exit 0 once the queue has nothing pending, running or retrying (tasks scheduled later are not waited for)")
	fs.DurationVar(&f.cfg.ShutdownTimeout, "shutdown-timeout", 30*time.Second, "on SIGTERM, time running tasks get to finish before they are handed back")
	fs.DurationVar(&f.cfg.Retention, "retention", queue.DefaultRetention, "how long succeeded and cancelled tasks are kept (their counts stay); negative keeps them")
	fs.IntVar(&f.maxOutput, "max-output", queue.DefaultMaxOutput, "largest result an exec handler may print, in bytes")
	fs.DurationVar(&f.grace, "grace", 5*time.Second, "time between SIGTERM and SIGKILL when a task's process is stopped")
	fs.BoolVar(&f.asJSON, "json", false, "print the worker's counts as JSON when it stops")
	fs.StringArrayVar(&f.limits, "limit", nil, "fleet-wide rate limit 'NAME=RATE[;burst=N][;types=T1,T2]' (repeatable), e.g. openai=500/m; created in etcd if absent, else etcd's setting wins")
	fs.StringArrayVar(&f.quotas, "quota", nil, "fleet-wide concurrency quota 'NAME[:SUBJECT]=K[;types=T1,T2]' (repeatable): tenant=K per tenant, tenant:acme=2 for one tenant, type=K per task type, any other NAME a shared resource; over-quota tasks wait in the queue")
	fs.StringArrayVar(&f.breakers, "breaker", nil, "circuit breaker shared by the fleet 'NAME[;failures=5][;cooldown=30s][;ratio=0.5;window=1m;min-calls=20][;types=T1,T2]' (repeatable): open after N consecutive failures or a failure ratio over a window, defer tasks while open")
	fs.StringVar(&f.metricsListen, "metrics-listen", "", "host:port to serve Prometheus metrics on (/metrics), e.g. 127.0.0.1:9090")
	fs.DurationVar(&f.depthInterval, "depth-interval", 10*time.Second, "with --metrics-listen: how often the queue's tasks are counted by state")
}

// runWorker checks the flags, then runs the worker that package fleet
// assembles until a signal, the drained queue or the loss of its lease.
func (a *app) runWorker(ctx context.Context, f *workerFlags) error {
	if err := a.checkGlobal(); err != nil {
		return err
	}
	usageDir, err := os.MkdirTemp("", "drover-usage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(usageDir)
	cfg, err := a.workerConfig(f, usageDir)
	if err != nil {
		return err
	}
	// What an exec handler's command reports with drover usage is settled
	// by the worker's budget gate.
	var w *fleet.Worker
	cfg.Handler = withUsage(cfg.Handler, usageDir, func(t *queue.Task, n int64, h http.Header) { w.Budgets().UsedWithHeaders(t, n, h) })
	ctx, stop := signal.NotifyContext(ctx, syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	stopMetrics, err := a.serveMetrics(ctx, f.metricsListen)
	if err != nil {
		return err
	}
	defer stopMetrics()
	if f.metricsListen != "" {
		cfg.Worker.DepthInterval = f.depthInterval
	}
	cli, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	defer a.closeStreams(cli) // after the worker's Close: its attempts ended
	w, err = fleet.NewWorker(ctx, cli, cfg)
	if errors.Is(err, registry.ErrDuplicate) {
		if cfg.Worker.WorkerID != "" {
			err = fmt.Errorf("%w (another worker runs with --worker-id %s)", err, cfg.Worker.WorkerID)
		}
		return withCode(ExitUsage, err)
	}
	if err != nil {
		return err
	}
	defer w.Close(context.Background())
	runErr := w.Run(ctx)
	if errors.Is(runErr, lease.ErrLost) {
		runErr = withCode(ExitLeaseLost, runErr)
	}
	st := w.Stats()
	if f.asJSON {
		_ = json.NewEncoder(a.stdout).Encode(st)
	} else {
		a.logger.Info("worker stopped", "claimed", st.Claimed, "succeeded", st.Succeeded, "retried", st.Retried,
			"dead", st.Dead, "handed_back", st.HandedBack, "fenced", st.Fenced)
	}
	return runErr
}

// workerConfig checks the flags and reads them into the worker's
// configuration, naming the flag in errors. An exec handler's command
// reports its usage in usageDir (drover usage).
func (a *app) workerConfig(f *workerFlags, usageDir string) (fleet.Config, error) {
	cfg := f.cfg
	cfg.Namespace, cfg.Logger = a.namespace, a.logger
	if err := cfg.Validate(); err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) {
			return fleet.Config{}, ie.Renamed("--" + strings.ReplaceAll(ie.Field, " ", "-"))
		}
		return fleet.Config{}, err
	}
	if cfg.Concurrency == 0 {
		return fleet.Config{}, &drover.InputError{Field: "--concurrency", Value: 0, Rule: "must be between 1 and 10000"}
	}
	if err := checkWorkerFlags(cfg, f.maxOutput, f.grace, f.depthInterval); err != nil {
		return fleet.Config{}, err
	}
	spec, err := flow.ParseSpec(f.limits, f.quotas, f.breakers)
	if err != nil {
		return fleet.Config{}, err
	}
	h, err := workerHandler(f.handler, f.maxOutput, f.grace, append(a.childEnv(), EnvUsageDir+"="+usageDir))
	if err != nil {
		return fleet.Config{}, err
	}
	return fleet.Config{Worker: cfg, Flow: spec, Handler: h}, nil
}

// workerHandler reads --handler: 'exec:CMD ARGS' or noop; an exec
// handler's command runs with env added to its environment.
func workerHandler(handler string, maxOutput int, grace time.Duration, env []string) (queue.Handler, error) {
	switch {
	case handler == "noop":
		return func(ctx context.Context, t *queue.Task) ([]byte, error) { return nil, nil }, nil
	case strings.HasPrefix(handler, "exec:") && strings.TrimSpace(strings.TrimPrefix(handler, "exec:")) != "":
		argv := []string{"sh", "-c", strings.TrimPrefix(handler, "exec:")}
		return queue.ExecHandlerEnv(argv, env, maxOutput, grace, os.Stderr), nil
	}
	return nil, &drover.InputError{Field: "--handler", Value: handler, Rule: "must be 'exec:CMD ARGS' or noop"}
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

// childEnv is what an exec handler's command needs to reach the same
// etcd and namespace as the worker (drover emit): the global flags as
// the environment variables they fall back to, credentials included
// (in the environment, never in a command line).
func (a *app) childEnv() []string {
	cfg := a.clientConfig()
	env := []string{"ETCD_ENDPOINTS=" + strings.Join(cfg.Endpoints, ","), "DROVER_NAMESPACE=" + a.namespace}
	for _, v := range []struct{ name, val string }{{"ETCDCTL_CACERT", cfg.CACert}, {"ETCDCTL_CERT", cfg.Cert}, {"ETCDCTL_KEY", cfg.Key},
		{"ETCDCTL_USER", cfg.Username}, {"ETCDCTL_PASSWORD", cfg.Password}} {
		if v.val != "" {
			env = append(env, v.name+"="+v.val)
		}
	}
	return env
}
