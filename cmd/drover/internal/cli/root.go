// Package cli is the drover command line: one cobra command tree that every
// subcommand hangs off, with the connection flags and exit codes they share.
package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/internal/buildinfo"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/tracing"
	"github.com/droverhq/drover/tracing/otelspan"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// Exit codes. Commands that run another program (lock run) pass its code
// through instead.
const (
	ExitOK          = 0
	ExitFailure     = 1
	ExitUsage       = 2  // bad flags, arguments or input
	ExitUnavailable = 69 // etcd could not be reached
	ExitLockLost    = 70 // lock run: the lock was lost while the command ran
	ExitLeaseLost   = 70 // registry register, worker: the primary lease was lost
	ExitBusy        = 75 // the lock is held by someone else, the queue is full, or the store is full (try again later)
)

// exitError carries an exit code up to Main.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// withCode attaches an exit code to err.
func withCode(code int, err error) error { return &exitError{code: code, err: err} }

// app holds what the commands share: the global flags and the streams.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer

	endpoints   string
	namespace   string
	dialTimeout time.Duration
	logFormat   string
	logLevel    string
	lockBackend string
	etcdTLS     etcdTLSFlags

	logger *slog.Logger
	// tracing is the OpenTelemetry setup of the command (package
	// tracing): off unless the OTEL_* environment asks for traces.
	tracing *tracing.Provider
}

// etcdTLSFlags are the global flags for an etcd with TLS or auth.
type etcdTLSFlags struct {
	caCert, cert, key, user string
}

// clientConfig is the etcd client configuration of the global flags. The
// TLS files and the user fall back to etcdctl's own environment variables
// (ETCDCTL_CACERT, ETCDCTL_CERT, ETCDCTL_KEY, ETCDCTL_USER as user:password);
// the password may also come from ETCDCTL_PASSWORD, so it need not be on
// the command line.
func (a *app) clientConfig() cluster.ClientConfig {
	pick := func(flag, env string) string {
		if flag != "" {
			return flag
		}
		return getenv(env)
	}
	user := pick(a.etcdTLS.user, "ETCDCTL_USER")
	name, pass, ok := strings.Cut(user, ":")
	if !ok {
		pass = getenv("ETCDCTL_PASSWORD")
	}
	return cluster.ClientConfig{
		Endpoints:   cluster.ResolveEndpoints(a.endpoints),
		DialTimeout: a.dialTimeout,
		CACert:      pick(a.etcdTLS.caCert, "ETCDCTL_CACERT"),
		Cert:        pick(a.etcdTLS.cert, "ETCDCTL_CERT"),
		Key:         pick(a.etcdTLS.key, "ETCDCTL_KEY"),
		Username:    name,
		Password:    pass,
	}
}

// Main runs the drover command line with args and returns the exit code.
func Main(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr}
	root := a.rootCommand()
	root.SetArgs(args)
	root.SetIn(stdin)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(context.Background())
	a.stopTracing()
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil && ee.err.Error() != "" {
			fmt.Fprintln(stderr, "drover:", ee.err)
		}
		if ee.code == ExitFailure && ee.err != nil && isNoSpace(ee.err) {
			fmt.Fprintln(stderr, "drover:", noSpaceAdvice)
			return ExitBusy
		}
		return ee.code
	}
	fmt.Fprintln(stderr, "drover:", err)
	if isNoSpace(err) && !errors.Is(err, drover.ErrStoreFull) { // a store-full error gives its own advice
		fmt.Fprintln(stderr, "drover:", noSpaceAdvice)
	}
	return exitCode(err)
}

// exitCode is the exit code of an error that carries none of its own.
func exitCode(err error) int {
	switch {
	// cobra's own error for an unknown command of the root.
	case errors.Is(err, drover.ErrInvalidInput) || isUsage(err) || strings.HasPrefix(err.Error(), "unknown command "):
		return ExitUsage
	case errors.Is(err, cluster.ErrUnreachable):
		return ExitUnavailable
	case errors.Is(err, drover.ErrStoreFull) || isNoSpace(err):
		// etcd's database is near its quota, or at it: try again once
		// space is freed.
		return ExitBusy
	}
	return ExitFailure
}

// noSpaceAdvice is what Main says after an error of etcd's NOSPACE alarm.
const noSpaceAdvice = "etcd's database is full (its NOSPACE alarm is raised): every write that adds data is refused until space is freed, " +
	"lease grants and locks included; free space with `drover tasks purge --queue Q --status SUCCEEDED --all` (or `drover dlq purge --queue Q --all`): " +
	"`drover server`'s store guard then compacts, defragments and disarms the alarm; then try again"

// isNoSpace reports whether err is etcd's refusal of a write under its
// NOSPACE alarm ("database space exceeded"), typed or only as text.
func isNoSpace(err error) bool {
	return errors.Is(err, rpctypes.ErrNoSpace) || strings.Contains(err.Error(), "database space exceeded")
}

// usageError marks errors in how a command was called.
type usageError struct{ error }

func isUsage(err error) bool {
	var ue usageError
	return errors.As(err, &ue)
}

func (a *app) rootCommand() *cobra.Command {
	root := &cobra.Command{
		Use:   "drover",
		Short: "The coordination plane for fleets of AI agents",
		Long: `drover coordinates fleets of AI agents on etcd: locks with fencing tokens,
leases whose loss cancels work, task runners with fenced step checkpoints,
durable queues with workers, fleet-wide flow control (rate limits, quotas,
circuit breakers), agent checkpoints and a service registry.

Every command except "server" talks to etcd at --etcd-endpoints, else
$ETCD_ENDPOINTS, else 127.0.0.1:2379. "drover server" runs one for you.`,
		Example: `  drover server &                              # embedded etcd in ./drover-data
  drover lock run nightly-report -- ./report.sh # run while holding a lock
  drover lock list --json`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := a.setupLogging(); err != nil {
				return err
			}
			a.startTracing(cmd)
			return nil
		},
	}
	root.SetFlagErrorFunc(explainFlagError)
	pf := root.PersistentFlags()
	pf.StringVar(&a.endpoints, "etcd-endpoints", "", "etcd endpoints, comma-separated (default $ETCD_ENDPOINTS, else 127.0.0.1:2379)")
	pf.StringVar(&a.namespace, "namespace", keyspace.DefaultNamespace, "namespace of every key drover reads or writes")
	pf.DurationVar(&a.dialTimeout, "dial-timeout", cluster.DefaultDialTimeout, "how long to try to reach etcd (or a lock backend, RabbitMQ, the Paxos nodes) before giving up")
	pf.StringVar(&a.etcdTLS.caCert, "etcd-cacert", "", "CA certificate (PEM) of an etcd with TLS (default $ETCDCTL_CACERT)")
	pf.StringVar(&a.etcdTLS.cert, "etcd-cert", "", "client certificate (PEM) for etcd, with --etcd-key (default $ETCDCTL_CERT)")
	pf.StringVar(&a.etcdTLS.key, "etcd-key", "", "client key (PEM) for etcd (default $ETCDCTL_KEY)")
	pf.StringVar(&a.etcdTLS.user, "etcd-user", "", "etcd user, as user or user:password (default $ETCDCTL_USER; password also from $ETCDCTL_PASSWORD)")
	pf.StringVar(&a.logFormat, "log-format", "text", "log format: text or json")
	pf.StringVar(&a.logLevel, "log-level", "info", "log level: debug, info, warn or error")

	info := buildinfo.Get()
	root.Version = fmt.Sprintf("%s (commit %s, %s)", info.Version, info.Commit, info.GoVersion)
	root.SetVersionTemplate("drover {{.Version}}\n")
	root.AddCommand(a.versionCommand(), a.serverCommand(), a.lockCommand(), a.paxosCommand(), a.taskCommand(), a.submitCommand(), a.workerCommand(), a.tasksCommand(), a.emitCommand(), a.usageCommand(), a.signalCommand(), a.dlqCommand(), a.registryCommand(), a.workersCommand(), a.limitsCommand(), a.budgetsCommand(), a.quotasCommand(), a.breakersCommand(), a.queuesCommand(), a.schedulesCommand(), a.demoCommand(), a.demoWorkerCommand(), a.lostUpdateWorkerCommand(),
		a.clusterCommand(), a.backupCommand(), a.restoreCommand())
	refuseUnknownSubcommands(root)
	return root
}

// refuseUnknownSubcommands makes every command group (a command with
// subcommands) fail with exit 2 on an argument that names none of its
// subcommands and that it does not take itself, suggesting the nearest;
// cobra does so for the root only, and printed help with exit 0 (or failed
// with exit 1) otherwise. A group with nothing to run of its own prints its
// help when called with no argument.
func refuseUnknownSubcommands(cmd *cobra.Command) {
	for _, c := range cmd.Commands() {
		refuseUnknownSubcommands(c)
	}
	if !cmd.HasSubCommands() {
		// A wrong number of arguments is a usage error too (exit 2).
		if own := cmd.Args; own != nil {
			cmd.Args = func(c *cobra.Command, args []string) error {
				if err := own(c, args); err != nil {
					if isUsage(err) {
						return err
					}
					return usageError{fmt.Errorf("%w (see '%s --help')", err, c.CommandPath())}
				}
				return nil
			}
		}
		return
	}
	if cmd.Parent() == nil {
		return
	}
	own := cmd.Args
	cmd.SuggestionsMinimumDistance = 2
	cmd.Args = func(c *cobra.Command, args []string) error {
		if len(args) == 0 || own != nil && own(c, args) == nil {
			return nil
		}
		msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
		if s := c.SuggestionsFor(args[0]); len(s) > 0 {
			msg += "\n\nDid you mean this?\n\t" + strings.Join(s, "\n\t")
		}
		return usageError{fmt.Errorf("%s\n\nRun '%s --help' for its commands", msg, c.CommandPath())}
	}
	if !cmd.Runnable() {
		cmd.RunE = func(c *cobra.Command, args []string) error { return c.Help() }
	}
}

func (a *app) setupLogging() error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(a.logLevel)); err != nil {
		return &drover.InputError{Field: "--log-level", Value: a.logLevel, Rule: "must be debug, info, warn or error"}
	}
	opts := &slog.HandlerOptions{Level: level}
	switch a.logFormat {
	case "text":
		a.logger = slog.New(slog.NewTextHandler(a.stderr, opts))
	case "json":
		a.logger = slog.New(slog.NewJSONHandler(a.stderr, opts))
	default:
		return &drover.InputError{Field: "--log-format", Value: a.logFormat, Rule: "must be text or json"}
	}
	slog.SetDefault(a.logger)
	return nil
}

// checkGlobal validates the connection flags before anything is contacted.
func (a *app) checkGlobal() error {
	if err := keyspace.CheckName("--namespace", a.namespace); err != nil {
		return err
	}
	if a.dialTimeout <= 0 {
		return &drover.InputError{Field: "--dial-timeout", Value: a.dialTimeout, Rule: "must be positive"}
	}
	return nil
}

// explainFlagError explains flags that did not parse. A negative number such as
// -1 reads as a flag: the error says so, and how to pass one.
func explainFlagError(cmd *cobra.Command, err error) error {
	if v, ok := negativeNumber(err); ok {
		return usageError{fmt.Errorf("%s reads as a flag, and %s has no such flag: a number there must not be negative "+
			"(see '%s --help' for each argument's rule); an argument that begins with '-' goes after --", v, cmd.CommandPath(), cmd.CommandPath())}
	}
	return usageError{fmt.Errorf("%w (see '%s --help')", err, cmd.CommandPath())}
}

// negativeArgError is the flag error function of a command whose one
// numeric argument, field, has rule: a negative number there is an
// InputError naming both.
func negativeArgError(field, rule string) func(*cobra.Command, error) error {
	return func(cmd *cobra.Command, err error) error {
		if v, ok := negativeNumber(err); ok {
			return &drover.InputError{Field: field, Value: v, Rule: rule}
		}
		return explainFlagError(cmd, err)
	}
}

// negativeNumber returns the argument ("-1", "-5/s") when err is an
// unknown shorthand flag that begins with a digit: a negative number.
func negativeNumber(err error) (string, bool) {
	var ne *pflag.NotExistError
	if !errors.As(err, &ne) {
		return "", false
	}
	s := ne.GetSpecifiedShortnames()
	if s == "" || (s[0] < '0' || s[0] > '9') && s[0] != '.' {
		return "", false
	}
	return "-" + s, true
}

// connect reaches etcd with the global flags, or fails with an error that
// says what was tried and what to do.
func (a *app) connect(ctx context.Context) (*clientv3.Client, error) {
	cli, err := cluster.Connect(ctx, a.clientConfig())
	if err != nil {
		var ie *drover.InputError
		if errors.As(err, &ie) {
			return nil, usageError{err}
		}
		return nil, withCode(ExitUnavailable, err)
	}
	return cli, nil
}

// etcd checks the connection flags, connects, and returns the client with
// its closer.
func (a *app) etcd(ctx context.Context) (*clientv3.Client, func(), error) {
	if err := a.checkGlobal(); err != nil {
		return nil, nil, err
	}
	cli, err := a.connect(ctx)
	if err != nil {
		return nil, nil, err
	}
	return cli, func() { cli.Close() }, nil
}

var getenv = os.Getenv

func (a *app) versionCommand() *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:     "version",
		Short:   "Print drover's version and commit",
		Example: "  drover version\n  drover version --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			info := buildinfo.Get()
			if asJSON {
				return json.NewEncoder(a.stdout).Encode(info)
			}
			fmt.Fprintf(a.stdout, "drover %s (commit %s, %s)\n", info.Version, info.Commit, info.GoVersion)
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// startTracing sets up OpenTelemetry from the standard environment
// variables (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME,
// OTEL_TRACES_SAMPLER, ...); nothing happens unless they ask for traces.
// service.name defaults to "drover-" and the command's name ("drover-worker").
// A setup that fails is logged, not fatal: tracing never stops the work.
// A TRACEPARENT in the environment is the parent of a short command's
// spans, when it traces.
func (a *app) startTracing(cmd *cobra.Command) {
	name := cmd
	for name.HasParent() && name.Parent().HasParent() {
		name = name.Parent()
	}
	p, err := tracing.Setup(cmd.Context(), "drover-"+name.Name())
	if err != nil {
		a.logger.Warn("tracing is off: its setup failed", "err", err)
		return
	}
	a.tracing = p
	// A command run by a traced process (an exec handler's drover submit
	// or emit, which gets TRACEPARENT) continues its caller's trace when
	// it traces too; the long-running commands start their own. One that
	// does not trace ignores TRACEPARENT, so that it stores no trace
	// context a worker of an older build could not read
	// (docs/observability.md, "Upgrading").
	if tp := os.Getenv("TRACEPARENT"); tp != "" && p.On() && name.Name() != "server" && name.Name() != "worker" {
		cmd.SetContext(otelspan.Remote(cmd.Context(), tp))
	}
}

// stopTracing exports the spans not yet sent, waiting at most 5 s.
func (a *app) stopTracing() {
	if a.tracing == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := a.tracing.Shutdown(ctx); err != nil && a.logger != nil {
		a.logger.Warn("tracing: could not export the last spans", "err", err)
	}
}
