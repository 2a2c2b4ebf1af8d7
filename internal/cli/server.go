package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// DefaultServerGCPercent is the embedded server's garbage collection target
// (Go's GOGC). Measured with 60,000 no-op tasks through one worker: about
// 12 % more tasks/s than Go's default of 100, for about 1.4x the server's
// peak memory (docs/BENCHMARKS.md).
const DefaultServerGCPercent = 200

func (a *app) serverCommand() *cobra.Command {
	var (
		dataDir       string
		listen        string
		peerListen    string
		retention     time.Duration
		metricsListen string
		gcPercent     int
	)
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Run drover's server with an embedded etcd (or against an existing cluster)",
		Long: `Run drover's server. By default it embeds a single-member etcd: data in
--data-dir, kept across restarts; clients on --etcd-listen; peers on a
loopback port; history compacted every --auto-compaction-retention.

With --etcd-endpoints (or $ETCD_ENDPOINTS) it embeds nothing and serves
against that existing etcd cluster instead.

The embedded etcd's in-memory index makes the process's heap large, so with
Go's default garbage collection setting a fifth of its CPU goes to collecting;
--gc-percent (default 200, or $GOGC when set and the flag is not) trades
memory for that CPU. Set $GOMEMLIMIT in memory-limited containers: the
collector then works harder as the limit nears instead of running out.

It logs one line when ready and shuts down cleanly on SIGINT or SIGTERM.`,
		Example: `  drover server
  drover server --data-dir /var/lib/drover --etcd-listen http://127.0.0.1:2379
  drover server --etcd-endpoints 10.0.0.5:2379,10.0.0.6:2379`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := a.checkGlobal(); err != nil {
				return err
			}
			if retention < 0 {
				return &drover.InputError{Field: "--auto-compaction-retention", Value: retention, Rule: "must be 0 (off) or positive"}
			}
			if gcPercent < 50 || gcPercent > 1000 {
				return &drover.InputError{Field: "--gc-percent", Value: gcPercent, Rule: "must be between 50 and 1000"}
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			external := a.endpoints != "" || strings.TrimSpace(getenv(cluster.EnvEndpoints)) != ""
			if external {
				for _, name := range []string{"data-dir", "etcd-listen", "etcd-peer-listen", "auto-compaction-retention", "gc-percent"} {
					if cmd.Flags().Changed(name) {
						return usageError{fmt.Errorf("--%s has no effect with --etcd-endpoints or $ETCD_ENDPOINTS: the server embeds no etcd then; drop one of them", name)}
					}
				}
				stopMetrics, err := a.serveMetrics(ctx, metricsListen, prometheus.DefaultGatherer)
				if err != nil {
					return err
				}
				defer stopMetrics()
				return a.serveExternal(ctx)
			}
			stopMetrics, err := a.serveMetrics(ctx, metricsListen, prometheus.DefaultGatherer)
			if err != nil {
				return err
			}
			defer stopMetrics()
			if cmd.Flags().Changed("gc-percent") || getenv("GOGC") == "" {
				debug.SetGCPercent(gcPercent)
			}
			cfg := cluster.EmbedConfig{
				DataDir:                 dataDir,
				ClientURL:               listen,
				PeerURL:                 peerListen,
				AutoCompactionRetention: retention,
				LogLevel:                "error",
			}
			if retention == 0 {
				cfg.AutoCompactionRetention = -1
			}
			if err := cfg.Validate(); err != nil {
				var ie *drover.InputError
				if errors.As(err, &ie) {
					switch ie.Field {
					case "ClientURL":
						return ie.Renamed("--etcd-listen")
					case "PeerURL":
						return ie.Renamed("--etcd-peer-listen")
					}
				}
				return usageError{err}
			}
			start := time.Now()
			a.logStarting(dataDir)
			srv, err := cluster.Embed(ctx, cfg)
			if err != nil {
				return startError(err, dataDir, listen, peerListen)
			}
			defer srv.Close()
			a.logger.Info("drover server ready",
				"etcd", "embedded", "endpoints", strings.Join(srv.Endpoints(), ","),
				"data_dir", srv.DataDir(), "namespace", a.namespace,
				"startup", time.Since(start).Round(time.Millisecond).String())
			select {
			case <-ctx.Done():
			case err := <-srv.Err():
				return fmt.Errorf("embedded etcd failed: %w", err)
			}
			a.logger.Info("drover server stopping", "reason", "signal")
			srv.Close()
			a.logger.Info("drover server stopped")
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", cluster.DefaultDataDir, "directory for etcd's data (kept across restarts)")
	f.StringVar(&listen, "etcd-listen", cluster.DefaultClientURL, "URL where the embedded etcd serves clients")
	f.StringVar(&peerListen, "etcd-peer-listen", cluster.DefaultPeerURL, "URL of the embedded etcd's peer listener (loopback)")
	f.DurationVar(&retention, "auto-compaction-retention", cluster.DefaultAutoCompactionRetention, "history kept before periodic compaction (0 turns compaction off)")
	f.StringVar(&metricsListen, "metrics-listen", "", "host:port to serve Prometheus metrics on (/metrics: drover's and the embedded etcd's)")
	f.IntVar(&gcPercent, "gc-percent", DefaultServerGCPercent, "garbage collection target of the embedded server (Go's GOGC; $GOGC wins when set and this flag is not)")
	return cmd
}

// serveExternal runs the server against an existing etcd cluster.
func (a *app) serveExternal(ctx context.Context) error {
	cli, err := a.connect(ctx)
	if err != nil {
		return err
	}
	defer cli.Close()
	a.logger.Info("drover server ready", "etcd", "external",
		"endpoints", strings.Join(cluster.ResolveEndpoints(a.endpoints), ","), "namespace", a.namespace)
	<-ctx.Done()
	a.logger.Info("drover server stopped")
	return nil
}

// logStarting says the server is starting, and when it reopens a data dir
// how large it is: reading a large one takes seconds before the server
// answers.
func (a *app) logStarting(dataDir string) {
	db := filepath.Join(dataDir, "member", "snap", "db")
	if st, err := os.Stat(db); err == nil {
		a.logger.Info("drover server loading its data dir; a large one takes a while", "data_dir", dataDir, "database_mib", st.Size()>>20)
		return
	}
	a.logger.Info("drover server starting", "data_dir", dataDir)
}

// startError explains why the embedded etcd did not start, with what to do
// about it. Causes in the flags or on the machine (a port in use, a data dir
// that cannot be written or is held by another server) exit 2.
func startError(err error, dataDir, listen, peerListen string) error {
	var inUse *cluster.DataDirInUseError
	switch {
	case errors.As(err, &inUse):
		return usageError{inUse}
	case errors.Is(err, syscall.EADDRINUSE):
		return usageError{fmt.Errorf("%w\nanother drover server or etcd listens on %s or %s: stop it, or choose other ports with --etcd-listen and --etcd-peer-listen", err, listen, peerListen)}
	case errors.Is(err, syscall.ENOTDIR):
		return usageError{fmt.Errorf("%w\n--data-dir %s: a part of that path is a file, not a directory; choose another --data-dir", err, dataDir)}
	case errors.Is(err, os.ErrPermission):
		return usageError{fmt.Errorf("%w\n--data-dir %s cannot be written by this user; choose another --data-dir, or fix its permissions", err, dataDir)}
	case errors.Is(err, context.Canceled):
		return withCode(ExitFailure, errors.New("stopped by a signal while starting"))
	}
	return err
}
