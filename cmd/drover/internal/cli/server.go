package cli

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/cluster"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/storeguard"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
)

// DefaultServerGCPercent is the embedded server's garbage collection target
// (Go's GOGC). Measured with 60,000 no-op tasks through one worker: about
// 12 % more tasks/s than Go's default of 100, for about 1.4x the server's
// peak memory (docs/bench-log/queue.md).
const DefaultServerGCPercent = 200

// serverFlags are the server command's own flags.
type serverFlags struct {
	dataDir       string
	listen        string
	peerListen    string
	retention     time.Duration
	metricsListen string
	gcPercent     int
	quota         int64
	highWater     waterMark
	lowWater      waterMark
	storeGuard    bool
	admission     *storeguard.Admission // the store guard's, see admitWrites
	http          httpFlags
	cluster       clusterFlags
}

// minQuotaBytes is the smallest --quota-backend-bytes the server takes.
const minQuotaBytes = 16 << 20

// serverLong and serverExample are the help of the server command.
const (
	serverLong = `Run drover's server. By default it embeds a single-member etcd: data in
--data-dir, kept across restarts; clients on --etcd-listen; peers on a
loopback port; history compacted every --auto-compaction-retention.

Three (or five) servers form one etcd cluster, replicated by etcd's raft:
give each its --name and the same --initial-cluster listing every member's
peer URL; each member's entry must be its --etcd-peer-listen (or
--etcd-advertise-peer). A server started with --join (client URLs of running
members) adds itself to that cluster instead, as a learner that is promoted
to a voter once it has caught up. A restarted member rejoins its cluster from
its --data-dir; --initial-cluster and --join are then not read. "drover
cluster status" shows the members; "drover cluster remove NAME" removes one.

Listening beyond loopback (--etcd-listen or --etcd-peer-listen on 0.0.0.0
or a private address) exposes etcd without TLS or authentication: anyone
who reaches the ports can read and write every key, and on the peer port
pose as a member. Do it on a private network only (a Kubernetes pod network
with a NetworkPolicy); elsewhere run etcd with TLS yourself and point drover
at it with --etcd-endpoints. A single member listens for peers on loopback
only; 0.0.0.0 needs --etcd-advertise-client and --etcd-advertise-peer.

With --etcd-endpoints (or $ETCD_ENDPOINTS) it embeds nothing and serves
against that existing etcd cluster instead.

The embedded etcd refuses every write that adds data once its database
reaches --quota-backend-bytes (4 GiB), lease grants included, so every lock
and worker would stop. The server keeps it from getting there: once the
database passes --high-water of the quota (default 70%) it refuses new tasks
and checkpoints in --namespace ("store full"; drover submit exits 75) while
leases and locks keep working, and accepts them again once less than
--low-water (default 60%) is in use. Free space with "drover tasks purge";
the server compacts and defragments by itself. Both marks take a percent
(70%) or a fraction (0.7).

The embedded etcd's in-memory index makes the process's heap large, so with
Go's default garbage collection setting a fifth of its CPU goes to collecting;
--gc-percent (default 200, or $GOGC when set and the flag is not) trades
memory for that CPU. Set $GOMEMLIMIT in memory-limited containers: the
collector then works harder as the limit nears instead of running out. On a
machine it shares with busy processes (an Agent Server runtime, workers), set
$GOMAXPROCS to the cores the server should use: Go otherwise schedules it over
every core and pays for waking idle threads (docs/deploy.md#resources).

It logs one line when ready and shuts down cleanly on SIGINT or SIGTERM.`
	serverExample = `  drover server
  drover server --data-dir /var/lib/drover --etcd-listen http://127.0.0.1:2379
  drover server --quota-backend-bytes 8589934592 --high-water 80% --low-water 70%
  drover server --name s1 --data-dir /var/lib/drover \
    --initial-cluster s1=http://127.0.0.1:2380,s2=http://127.0.0.1:12380,s3=http://127.0.0.1:22380 \
    --etcd-peer-listen http://127.0.0.1:2380 --etcd-listen http://127.0.0.1:2379
  drover server --name s4 --join http://127.0.0.1:2379 --data-dir /var/lib/drover-s4 \
    --etcd-peer-listen http://127.0.0.1:32380 --etcd-listen http://127.0.0.1:32379
  drover server --name drover-0 --data-dir /var/lib/drover \
    --initial-cluster drover-0=http://drover-0.drover:2380,drover-1=http://drover-1.drover:2380,drover-2=http://drover-2.drover:2380 \
    --etcd-peer-listen http://0.0.0.0:2380 --etcd-listen http://0.0.0.0:2379 \
    --etcd-advertise-peer http://drover-0.drover:2380 --etcd-advertise-client http://drover-0.drover:2379
  drover server --etcd-endpoints 10.0.0.5:2379,10.0.0.6:2379
  drover server --http-listen 127.0.0.1:8080
  drover server --http-listen 0.0.0.0:8443 --auth-file tokens.json --tls-cert cert.pem --tls-key key.pem`
)

func (a *app) serverCommand() *cobra.Command {
	f := serverFlags{highWater: waterMark(cluster.DefaultHighWater), lowWater: waterMark(cluster.DefaultLowWater)}
	cmd := &cobra.Command{
		Use:     "server",
		Short:   "Run drover's server with an embedded etcd (or against an existing cluster)",
		Long:    serverLong,
		Example: serverExample,
		Args:    cobra.NoArgs,
		RunE:    func(cmd *cobra.Command, args []string) error { return a.runServer(cmd, &f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.dataDir, "data-dir", cluster.DefaultDataDir, "directory for etcd's data (kept across restarts)")
	fl.StringVar(&f.listen, "etcd-listen", cluster.DefaultClientURL, "URL where the embedded etcd serves clients")
	fl.StringVar(&f.peerListen, "etcd-peer-listen", cluster.DefaultPeerURL, "URL of the embedded etcd's peer listener (loopback, unless --initial-cluster or --join)")
	fl.DurationVar(&f.retention, "auto-compaction-retention", cluster.DefaultAutoCompactionRetention, "history kept before periodic compaction (0 turns compaction off)")
	fl.StringVar(&f.metricsListen, "metrics-listen", "", "host:port to serve Prometheus metrics on (/metrics: drover's and the embedded etcd's)")
	fl.IntVar(&f.gcPercent, "gc-percent", DefaultServerGCPercent, "garbage collection target of the embedded server (Go's GOGC; $GOGC wins when set and this flag is not)")
	fl.Int64Var(&f.quota, "quota-backend-bytes", cluster.DefaultQuotaBackendBytes, "the embedded etcd's database quota in bytes (etcd advises at most 8 GiB)")
	fl.Var(&f.highWater, "high-water", "share of the quota past which new tasks, checkpoints, signals and stream events are refused (a percent, 70%, or a fraction, 0.7)")
	fl.StringVar(&f.http.listen, "http-listen", "", "host:port to serve the HTTP API on (JSON routes under /v1, OpenAPI at /openapi.json); nothing listens without it")
	fl.StringVar(&f.http.authFile, "auth-file", "", "JSON file of bearer tokens with their namespaces and roles (docs/http.md); required beyond loopback")
	fl.StringVar(&f.http.tlsCert, "tls-cert", "", "certificate (PEM) to serve the HTTP API over HTTPS, with --tls-key")
	fl.StringVar(&f.http.tlsKey, "tls-key", "", "private key (PEM) of --tls-cert")
	fl.BoolVar(&f.http.insecure, "insecure", false, "serve the HTTP API beyond loopback without --auth-file (a trusted network only)")
	fl.DurationVar(&f.http.requestTimeout, "http-request-timeout", defaultRequestTimeout,
		"the longest an HTTP request waits for etcd before a 503 with Retry-After (long polls: their wait more); 100ms or more")
	fl.Var(&f.lowWater, "low-water", "share of the quota in use under which they are accepted again; below --high-water")
	fl.BoolVar(&f.storeGuard, "store-guard", true, "guard etcd's space: refuse new tasks and checkpoints past --high-water, and compact, defragment and disarm a NOSPACE alarm (of every member of an --etcd-endpoints cluster too)")
	f.cluster.register(fl)
	return cmd
}

// check validates the server's flags before anything starts.
func (f *serverFlags) check() error {
	if f.retention < 0 {
		return &drover.InputError{Field: "--auto-compaction-retention", Value: f.retention, Rule: "must be 0 (off) or positive"}
	}
	if f.gcPercent < 50 || f.gcPercent > 1000 {
		return &drover.InputError{Field: "--gc-percent", Value: f.gcPercent, Rule: "must be between 50 and 1000"}
	}
	if f.quota < minQuotaBytes {
		return &drover.InputError{Field: "--quota-backend-bytes", Value: f.quota, Rule: fmt.Sprintf("must be at least %d (16 MiB)", minQuotaBytes)}
	}
	if h := float64(f.highWater); !(h > 0 && h < 1) {
		return &drover.InputError{Field: "--high-water", Value: f.highWater.String(), Rule: "must be above 0% and below 100% of the quota"}
	}
	if l := float64(f.lowWater); !(l > 0 && l < float64(f.highWater)) {
		return &drover.InputError{Field: "--low-water", Value: f.lowWater.String(), Rule: fmt.Sprintf("must be above 0%% and below --high-water (%s)", f.highWater.String())}
	}
	return nil
}

func (a *app) runServer(cmd *cobra.Command, f *serverFlags) error {
	if err := a.checkGlobal(); err != nil {
		return err
	}
	if err := f.check(); err != nil {
		return err
	}
	if err := f.http.check(); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	external := a.endpoints != "" || strings.TrimSpace(getenv(cluster.EnvEndpoints)) != ""
	if external {
		for _, name := range append([]string{"data-dir", "etcd-listen", "etcd-peer-listen", "auto-compaction-retention", "gc-percent", "quota-backend-bytes"}, clusterFlagNames...) {
			if cmd.Flags().Changed(name) {
				return usageError{fmt.Errorf("--%s has no effect with --etcd-endpoints or $ETCD_ENDPOINTS: the server embeds no etcd then; drop one of them", name)}
			}
		}
	}
	stopMetrics, err := a.serveMetrics(ctx, f.metricsListen, prometheus.DefaultGatherer)
	if err != nil {
		return err
	}
	defer stopMetrics()
	if external {
		return a.serveExternal(ctx, f)
	}
	if cmd.Flags().Changed("gc-percent") || getenv("GOGC") == "" {
		debug.SetGCPercent(f.gcPercent)
	}
	return a.serveEmbedded(ctx, f)
}

// serveEmbedded runs the server with an embedded etcd and its store guard
// until ctx ends or etcd fails.
func (a *app) serveEmbedded(ctx context.Context, f *serverFlags) error {
	cfg := cluster.EmbedConfig{
		DataDir:                 f.dataDir,
		ClientURL:               f.listen,
		PeerURL:                 f.peerListen,
		AutoCompactionRetention: f.retention,
		LogLevel:                "error",
		QuotaBackendBytes:       f.quota,
	}
	if f.retention == 0 {
		cfg.AutoCompactionRetention = -1
	}
	f.cluster.apply(&cfg)
	if err := cfg.Validate(); err != nil {
		if errors.Is(err, drover.ErrInvalidInput) {
			return embedFlagError(err)
		}
		return usageError{err}
	}
	if out := exposed(cfg); len(out) > 0 {
		a.logger.Warn("etcd listens beyond loopback without TLS or authentication: whoever reaches these ports can read and write every key; keep them on a private network",
			"urls", strings.Join(out, ","))
	}
	start := time.Now()
	a.logStarting(f.dataDir)
	srv, err := cluster.Embed(ctx, cfg)
	if err != nil {
		return startError(err, f.dataDir, f.listen, f.peerListen)
	}
	defer func() { _ = srv.Close(context.WithoutCancel(ctx)) }()
	stopGuard, err := a.startEmbeddedGuard(ctx, srv, f)
	if err != nil {
		return err
	}
	defer stopGuard()
	cli, err := embeddedClient(ctx, srv)
	if err != nil {
		return err
	}
	f.admitWrites(cli)
	closeCli := sync.OnceFunc(func() { _ = cli.Close() }) // before the server: it calls the server in process
	defer closeCli()
	stopHTTP, err := a.startServing(ctx, &f.http, cli) // the HTTP API and the schedules
	if err != nil {
		return err
	}
	defer stopHTTP()
	a.logger.Info("drover server ready",
		"etcd", "embedded", "endpoints", strings.Join(srv.Endpoints(), ","),
		"name", srv.Name(), "member_id", fmt.Sprintf("%x", srv.MemberID()), "members", srv.Members(),
		"data_dir", srv.DataDir(), "namespace", a.namespace,
		"quota_mib", srv.Quota()>>20, "high_water", f.highWater.String(), "low_water", f.lowWater.String(),
		"gomaxprocs", runtime.GOMAXPROCS(0), "startup", time.Since(start).Round(time.Millisecond).String())
	select {
	case <-ctx.Done():
	case err := <-srv.Err():
		return fmt.Errorf("embedded etcd failed: %w", err)
	case <-srv.Stopped():
		return fmt.Errorf("embedded etcd stopped: this member was removed from its cluster (or failed); "+
			"to bring it back, remove --data-dir %s and start it with --join", f.dataDir)
	}
	a.logger.Info("drover server stopping", "reason", "signal")
	stopHTTP()
	a.closeStreams(cli)
	closeCli()
	stopGuard()
	// The maintenance goroutine's defragmentation, if one runs, is
	// cancelled by Close; the bound only keeps a stuck one from holding
	// the exit.
	closeCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Close(closeCtx); err != nil {
		a.logger.Warn("drover server closed without its maintenance goroutine ending", "err", err)
	}
	a.logger.Info("drover server stopped")
	return nil
}

// waterMark is a share of the database quota, given as a percent ("70%")
// or a fraction ("0.7").
type waterMark float64

// String implements pflag.Value.
func (w *waterMark) String() string {
	return strconv.FormatFloat(math.Round(float64(*w)*1000)/10, 'f', -1, 64) + "%"
}

// Set implements pflag.Value.
func (w *waterMark) Set(s string) error {
	s = strings.TrimSpace(s)
	p, percent := strings.CutSuffix(s, "%")
	v, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
	switch {
	case err != nil || math.IsNaN(v) || math.IsInf(v, 0):
		return errors.New("must be a percent such as 70% or a fraction such as 0.7")
	case percent:
		v /= 100
	case v >= 1:
		return fmt.Errorf("a fraction must be below 1: write a percent with its sign (%s%%)", s)
	}
	*w = waterMark(v)
	return nil
}

// Type implements pflag.Value.
func (w *waterMark) Type() string { return "percent" }

// serveExternal runs the server against an existing etcd cluster, with a
// store guard of each of its members unless --store-guard=false.
func (a *app) serveExternal(ctx context.Context, f *serverFlags) error {
	cli, err := a.connect(ctx)
	if err != nil {
		return serverConnectError(err)
	}
	defer cli.Close()
	f.admitWrites(cli)
	stopGuard := func() {}
	if f.storeGuard {
		stopGuard = a.startExternalGuards(ctx, cli, f)
	}
	defer stopGuard()
	stopHTTP, err := a.startServing(ctx, &f.http, cli) // the HTTP API and the schedules
	if err != nil {
		return err
	}
	defer stopHTTP()
	a.logger.Info("drover server ready", "etcd", "external",
		"endpoints", strings.Join(cluster.ResolveEndpoints(a.endpoints), ","), "namespace", a.namespace,
		"store_guard", f.storeGuard, "high_water", f.highWater.String(), "low_water", f.lowWater.String(),
		"gomaxprocs", runtime.GOMAXPROCS(0))
	<-ctx.Done()
	stopHTTP()
	a.closeStreams(cli)
	stopGuard()
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

// etcdUnreachable is an etcd the server was pointed at that did not answer.
// Its advice is the server's own: the client commands' "start `drover
// server`" would tell the server to start itself.
type etcdUnreachable struct{ *cluster.UnreachableError }

// Error implements error.
func (e etcdUnreachable) Error() string {
	return fmt.Sprintf("cannot reach etcd at %s (tried for %s: %v): is etcd running there? check that --etcd-endpoints (or $%s) "+
		"names its client URLs (with --etcd-cacert, --etcd-cert and --etcd-key if it serves TLS); without either, drover server runs an etcd of its own",
		strings.Join(e.Endpoints, ","), e.Timeout, e.Err, cluster.EnvEndpoints)
}

// Unwrap returns the client's error.
func (e etcdUnreachable) Unwrap() error { return e.UnreachableError }

// serverConnectError gives an unreachable etcd the server's advice.
func serverConnectError(err error) error {
	var ue *cluster.UnreachableError
	if !errors.As(err, &ue) {
		return err
	}
	return withCode(ExitUnavailable, etcdUnreachable{ue})
}

// serveMetrics serves drover's metrics (and extra gatherers) on addr until
// the returned stop is called; "" serves nothing. A bad or busy address
// fails at once.
func (a *app) serveMetrics(ctx context.Context, addr string, extra ...prometheus.Gatherer) (stop func(), err error) {
	if addr == "" {
		return func() {}, nil
	}
	l, err := metrics.Listen(addr)
	if err != nil {
		return nil, usageError{err}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := metrics.Serve(ctx, l, a.logger, extra...); err != nil {
			a.logger.Error("metrics server failed", "err", err)
		}
	}()
	return func() { cancel(); <-done }, nil
}
