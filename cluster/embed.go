package cluster

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/droverhq/drover"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Defaults of [EmbedConfig].
const (
	DefaultDataDir                 = "./drover-data"
	DefaultClientURL               = "http://127.0.0.1:2379"
	DefaultPeerURL                 = "http://127.0.0.1:2380"
	DefaultMemberName              = "drover"
	DefaultAutoCompactionRetention = time.Hour
	DefaultStartTimeout            = 60 * time.Second
	// DefaultQuotaBackendBytes is the embedded etcd's database quota.
	DefaultQuotaBackendBytes = 4 << 30
	// DefaultDefragInterval is how often the embedded server checks
	// whether its database file is worth defragmenting.
	DefaultDefragInterval = 10 * time.Minute
)

// EmbedConfig configures an embedded single-member etcd server. The zero value
// is valid and means the defaults.
type EmbedConfig struct {
	// DataDir holds etcd's data; it survives restarts. Default ./drover-data.
	DataDir string
	// ClientURL is where etcd serves clients. Default http://127.0.0.1:2379.
	ClientURL string
	// PeerURL is etcd's peer listener, on a loopback port. Default
	// http://127.0.0.1:2380.
	PeerURL string
	// Name is the member name. Default "drover".
	Name string
	// AutoCompactionRetention keeps this much history; older revisions are
	// compacted periodically. Zero means one hour; negative turns compaction
	// off.
	AutoCompactionRetention time.Duration
	// UnsafeNoFsync skips fsync: much faster, loses data on a machine crash.
	// For tests and throw-away runs only.
	UnsafeNoFsync bool
	// LogLevel is etcd's own log level ("debug", "info", "warn", "error").
	// Default "error": drover logs what matters itself.
	LogLevel string
	// StartTimeout bounds how long Embed waits for the server to be ready.
	// Default one minute.
	StartTimeout time.Duration
	// QuotaBackendBytes is the database quota (default 4 GiB). Past it etcd
	// refuses writes until space is freed.
	QuotaBackendBytes int64
	// DefragInterval is how often the server checks its database file and
	// defragments it when at least 64 MiB and half of it is free space
	// left by compaction. Zero means 10 minutes; negative turns it off.
	DefragInterval time.Duration
}

func (c EmbedConfig) withDefaults() EmbedConfig {
	if c.DataDir == "" {
		c.DataDir = DefaultDataDir
	}
	if c.ClientURL == "" {
		c.ClientURL = DefaultClientURL
	}
	if c.PeerURL == "" {
		c.PeerURL = DefaultPeerURL
	}
	if c.Name == "" {
		c.Name = DefaultMemberName
	}
	if c.AutoCompactionRetention == 0 {
		c.AutoCompactionRetention = DefaultAutoCompactionRetention
	}
	if c.LogLevel == "" {
		c.LogLevel = "error"
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	if c.QuotaBackendBytes == 0 {
		c.QuotaBackendBytes = DefaultQuotaBackendBytes
	}
	if c.DefragInterval == 0 {
		c.DefragInterval = DefaultDefragInterval
	}
	return c
}

// Validate reports the first field that is not usable.
func (c EmbedConfig) Validate() error {
	c = c.withDefaults()
	if !listenURL(c.ClientURL, false) {
		return &drover.InputError{Field: "ClientURL", Value: c.ClientURL, Rule: "must be http(s)://IP:PORT with no path, such as http://127.0.0.1:2379"}
	}
	if !listenURL(c.PeerURL, true) {
		return &drover.InputError{Field: "PeerURL", Value: c.PeerURL, Rule: "must be http(s)://LOOPBACK-IP:PORT with no path, such as http://127.0.0.1:2380: the embedded etcd has no peers"}
	}
	if cu, pu := hostPort(c.ClientURL), hostPort(c.PeerURL); cu == pu {
		return &drover.InputError{Field: "PeerURL", Value: c.PeerURL, Rule: "must not be the client URL's address and port: the two listeners need a port each"}
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		return fmt.Errorf("cluster: LogLevel %q: must be debug, info, warn or error", c.LogLevel)
	}
	if c.StartTimeout < 0 {
		return fmt.Errorf("cluster: StartTimeout %s: must not be negative", c.StartTimeout)
	}
	return nil
}

// listenURL reports whether raw is a URL etcd can listen on: http or https,
// an IP address (etcd binds to IPs, not names; a loopback one if loopback is
// set) and a port, and no path.
// hostPort is the host and port of a URL that listenURL accepted.
func hostPort(raw string) string {
	u, _ := url.Parse(raw)
	return u.Host
}

func listenURL(raw string, loopback bool) bool {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return false
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || port == "" {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && (!loopback || ip.IsLoopback())
}

// Server is a running embedded etcd server.
type Server struct {
	etcd      *embed.Etcd
	endpoints []string
	dataDir   string
	quota     int64
	logLevel  zap.AtomicLevel
	closeOnce sync.Once
	unlock    func()        // releases the data dir's lock file
	stop      chan struct{} // closed by Close: maintenance ends
	done      chan struct{} // closed when maintenance has ended
}

// Embed starts an embedded etcd server and waits until it serves clients, ctx
// is done, or cfg.StartTimeout passes. Data in cfg.DataDir from an earlier run
// is kept.
func Embed(ctx context.Context, cfg EmbedConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: create data dir: %w", err)
	}
	unlock, err := lockDataDir(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	s, err := start(ctx, cfg)
	if err != nil {
		unlock()
		return nil, err
	}
	s.unlock = unlock
	return s, nil
}

// start starts etcd in cfg.DataDir, which the caller holds, and waits until
// it serves clients. etcd's own start (opening and reading the database,
// which takes seconds for a large one) cannot be interrupted, so it runs
// in a goroutine: when ctx ends first, start returns at once and the
// goroutine closes the server when its start returns.
func start(ctx context.Context, cfg EmbedConfig) (*Server, error) {
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.DataDir
	cu, _ := url.Parse(cfg.ClientURL)
	pu, _ := url.Parse(cfg.PeerURL)
	ec.ListenClientUrls = []url.URL{*cu}
	ec.AdvertiseClientUrls = []url.URL{*cu}
	ec.ListenPeerUrls = []url.URL{*pu}
	ec.AdvertisePeerUrls = []url.URL{*pu}
	ec.InitialCluster = cfg.Name + "=" + pu.String()
	if cfg.AutoCompactionRetention > 0 {
		ec.AutoCompactionMode = "periodic"
		ec.AutoCompactionRetention = cfg.AutoCompactionRetention.String()
	} else {
		ec.AutoCompactionRetention = "0"
	}
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	level, _ := zapcore.ParseLevel(cfg.LogLevel)
	zc := zap.NewProductionConfig()
	// Quiet while starting: a failed start is returned as an error (with
	// its cause), not also logged by etcd in its own format; once the
	// server is ready it logs at cfg.LogLevel.
	zc.Level = zap.NewAtomicLevelAt(zapcore.FatalLevel)
	zc.DisableStacktrace = true
	zc.Sampling = nil
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	lg, err := zc.Build()
	if err != nil {
		return nil, fmt.Errorf("cluster: build etcd logger: %w", err)
	}
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(lg)
	ec.LogLevel = cfg.LogLevel

	type started struct {
		e   *embed.Etcd
		err error
	}
	ch := make(chan started, 1)
	go func() {
		e, err := embed.StartEtcd(ec)
		ch <- started{e, err}
	}()
	var e *embed.Etcd
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("cluster: start embedded etcd in %s on %s: %w", cfg.DataDir, cfg.ClientURL, r.err)
		}
		e = r.e
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.e != nil {
				r.e.Close()
			}
		}()
		return nil, fmt.Errorf("cluster: start embedded etcd: %w", ctx.Err())
	}
	timer := time.NewTimer(cfg.StartTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("cluster: embedded etcd failed while starting: %w", err)
	case <-timer.C:
		e.Server.Stop()
		e.Close()
		return nil, fmt.Errorf("cluster: embedded etcd was not ready within %s", cfg.StartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("cluster: start embedded etcd: %w", ctx.Err())
	}
	zc.Level.SetLevel(level)
	s := &Server{etcd: e, dataDir: cfg.DataDir, quota: cfg.QuotaBackendBytes, logLevel: zc.Level, stop: make(chan struct{}), done: make(chan struct{})}
	for _, l := range e.Clients {
		s.endpoints = append(s.endpoints, l.Addr().String())
	}
	if cfg.DefragInterval > 0 {
		go s.maintain(cfg.DefragInterval)
	} else {
		close(s.done)
	}
	return s, nil
}

// Defrag thresholds: defragment once the file is at least minDefragBytes and
// at least half of it is free.
const minDefragBytes = 64 << 20

// maintain defragments the database file when compaction has left enough of
// it free. It ends when the server closes.
func (s *Server) maintain(every time.Duration) {
	defer close(s.done)
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-s.stop
		cancel()
	}()
	for {
		select {
		case <-s.stop:
			return
		case <-time.After(every):
		}
		_, _ = s.DefragIfWorth(ctx, cli)
	}
}

// DefragIfWorth defragments the server's database when it is at least 64 MiB
// and at least half of it is free space, and reports whether it did. The
// server stalls while it defragments (about a second per GiB).
func (s *Server) DefragIfWorth(ctx context.Context, cli *clientv3.Client) (bool, error) {
	st, err := cli.Status(ctx, s.endpoints[0])
	if err != nil {
		return false, fmt.Errorf("cluster: status: %w", err)
	}
	if st.DbSize < minDefragBytes || st.DbSizeInUse > st.DbSize/2 {
		return false, nil
	}
	if _, err := cli.Defragment(ctx, s.endpoints[0]); err != nil {
		return false, fmt.Errorf("cluster: defragment: %w", err)
	}
	return true, nil
}

// Endpoints returns the addresses where the server serves clients.
func (s *Server) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// DataDir returns the server's data directory.
func (s *Server) DataDir() string { return s.dataDir }

// Quota returns the server's database quota in bytes
// (EmbedConfig.QuotaBackendBytes); negative means none.
func (s *Server) Quota() int64 { return s.quota }

// Err returns a channel that receives an error if the server fails while
// running.
func (s *Server) Err() <-chan error { return s.etcd.Err() }

// Close stops the server: it ends the maintenance goroutine, stops accepting
// clients, closes open client connections and watches, then syncs and closes
// the data files, and releases the data dir's lock. It is safe to call more
// than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.stop)
		<-s.done
		// etcd reports its own listeners closing as errors; on purpose
		// they are not.
		s.logLevel.SetLevel(zap.FatalLevel)
		s.etcd.Close()
		if s.unlock != nil {
			s.unlock()
		}
	})
}

// FreeLoopbackAddr returns a 127.0.0.1 host:port that was free a moment ago,
// for servers that must be told their port before they listen (etcd's peer
// and client URLs). Another process may take it in between; callers retry or
// fail.
func FreeLoopbackAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("cluster: find a free loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
