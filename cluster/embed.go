package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/droverhq/drover/internal/lifecycle"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Server is a running embedded etcd server.
type Server struct {
	etcd      *embed.Etcd
	endpoints []string
	dataDir   string
	name      string
	quota     int64
	logLevel  zap.AtomicLevel
	level     zapcore.Level // etcd's log level once started
	closeOnce sync.Once
	unlock    func() // releases the data dir's lock file
	// maintenance runs the defragmenting goroutine; Close stops it.
	maintenance lifecycle.Lifecycle
}

// ErrRestoreLeftover is matched by the error of Embed when its data dir
// holds no member and an interrupted restore's work directory is there.
var ErrRestoreLeftover = errors.New("cluster: an interrupted restore's work directory is there")

// Embed starts an embedded etcd server and waits until it serves clients, ctx
// is done, or cfg.StartTimeout passes (a joining member's start: each of up
// to three starts, after a wait of at most 15 s for the members to list it,
// so about three times StartTimeout at worst). Data in cfg.DataDir from an earlier run
// is kept: a restarted member rejoins its cluster whatever cfg.InitialCluster
// says. With cfg.Join and a data dir that holds no member yet, Embed first
// adds the member to the running cluster and starts it once the other
// members list it (see startJoining); a member that starts as a learner is
// promoted to a voter before Embed returns. A member it added and could
// not start it removes again (see JoinError). Embed refuses a data dir that
// holds no member while an interrupted restore's work directory is there
// (see Restore).
func Embed(ctx context.Context, cfg EmbedConfig) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if !HasMember(cfg.DataDir) {
		if left := restoreLeftovers(cfg.DataDir); len(left) > 0 {
			return nil, fmt.Errorf("%w: data dir %s holds no member, and %s is there: a restore into it was interrupted (or still runs); "+
				"once none runs, remove %s, then restore again, or start without it", ErrRestoreLeftover, cfg.DataDir, left[0], strings.Join(left, " "))
		}
	}
	// What this call creates, a failed start removes again: no empty data
	// dir or lock file is left behind by a server that never ran.
	newDir := !exists(cfg.DataDir)
	lockPath := filepath.Join(cfg.DataDir, lockFileName)
	newLock := !exists(lockPath)
	if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
		return nil, fmt.Errorf("cluster: create data dir: %w", err)
	}
	held, err := lockDataDir(cfg.DataDir)
	if err != nil {
		if newDir {
			_ = os.Remove(cfg.DataDir)
		}
		return nil, err
	}
	unlock := func() { // on failure: removes what this call created
		if newLock {
			_ = os.Remove(lockPath) // while still held, then let go
		}
		held()
		if newDir {
			_ = os.Remove(cfg.DataDir) // only when empty
		}
	}
	var added *addedMember
	switch {
	case len(cfg.Join) == 0:
	case HasMember(cfg.DataDir):
		// A restart: etcd reads its cluster from the data dir.
		cfg.InitialCluster = cfg.Name + "=" + cfg.AdvertisePeerURL
	default:
		if added, err = addMember(ctx, cfg); err != nil {
			unlock()
			return nil, err
		}
		cfg.InitialCluster, cfg.InitialClusterState = added.initialCluster, ClusterStateExisting
	}
	_, statErr := os.Stat(filepath.Join(cfg.DataDir, "member"))
	var s *Server
	if added != nil {
		s, err = startJoining(ctx, cfg, added, statErr == nil)
	} else {
		s, err = start(ctx, cfg)
	}
	if err != nil {
		if added != nil {
			err = undoJoin(ctx, cfg, added, err, statErr == nil)
		}
		unlock()
		return nil, err
	}
	s.unlock = held
	if s.etcd.Server.IsLearner() {
		if err := s.promote(ctx, cfg); err != nil {
			_ = s.Close(context.WithoutCancel(ctx))
			return nil, err
		}
	}
	s.logLevel.SetLevel(s.level)
	return s, nil
}

// etcdConfig is the etcd configuration of cfg, with defaults.
func etcdConfig(cfg EmbedConfig) *embed.Config {
	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.DataDir
	cu, _ := url.Parse(cfg.ClientURL)
	pu, _ := url.Parse(cfg.PeerURL)
	acu, _ := url.Parse(cfg.AdvertiseClientURL)
	apu, _ := url.Parse(cfg.AdvertisePeerURL)
	ec.ListenClientUrls = []url.URL{*cu}
	ec.AdvertiseClientUrls = []url.URL{*acu}
	ec.ListenPeerUrls = []url.URL{*pu}
	ec.AdvertisePeerUrls = []url.URL{*apu}
	ec.InitialCluster = cfg.InitialCluster
	ec.ClusterState = cfg.InitialClusterState
	if cfg.AutoCompactionRetention > 0 {
		ec.AutoCompactionMode = "periodic"
		ec.AutoCompactionRetention = cfg.AutoCompactionRetention.String()
	} else {
		ec.AutoCompactionRetention = "0"
	}
	ec.UnsafeNoFsync = cfg.UnsafeNoFsync
	ec.QuotaBackendBytes = cfg.QuotaBackendBytes
	return ec
}

// start starts etcd in cfg.DataDir, which the caller holds, and waits until
// it serves clients. etcd's own start (opening and reading the database,
// which takes seconds for a large one) cannot be interrupted, so it runs
// in a goroutine: when ctx ends first, start returns at once and the
// goroutine closes the server when its start returns.
func start(ctx context.Context, cfg EmbedConfig) (*Server, error) {
	ec := etcdConfig(cfg)
	level, _ := zapcore.ParseLevel(cfg.LogLevel)
	zc := zap.NewProductionConfig()
	// Quiet while starting: a failed start is returned as an error (with
	// its cause), not also logged by etcd in its own format; once the
	// server is ready (and a joining member promoted) it logs at
	// cfg.LogLevel.
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

	e, err := startEtcd(ctx, ec, cfg)
	if err != nil {
		return nil, err
	}
	s := &Server{etcd: e, dataDir: cfg.DataDir, name: cfg.Name, quota: cfg.QuotaBackendBytes, logLevel: zc.Level, level: level}
	for _, l := range e.Clients {
		s.endpoints = append(s.endpoints, l.Addr().String())
	}
	if cfg.DefragInterval > 0 {
		s.maintenance.Start(context.Background(), func(ctx context.Context) { s.maintain(ctx, cfg.DefragInterval) })
	}
	return s, nil
}

// startEtcd starts etcd with ec and waits until it is ready (a member of
// a new cluster: until a quorum of members has started).
func startEtcd(ctx context.Context, ec *embed.Config, cfg EmbedConfig) (*embed.Etcd, error) {
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
		return e, nil
	case err := <-e.Err():
		e.Close()
		return nil, fmt.Errorf("cluster: embedded etcd failed while starting: %w", err)
	case <-e.Server.StopNotify():
		e.Close()
		return nil, fmt.Errorf("cluster: embedded etcd stopped while starting (was this member removed from its cluster? then remove --data-dir %s before it joins again)", cfg.DataDir)
	case <-timer.C:
		e.Server.Stop()
		e.Close()
		if strings.Contains(cfg.InitialCluster, ",") {
			return nil, fmt.Errorf("cluster: embedded etcd was not ready within %s: a member needs a quorum of its cluster's members running and reachable on their peer URLs (%s)", cfg.StartTimeout, cfg.InitialCluster)
		}
		return nil, fmt.Errorf("cluster: embedded etcd was not ready within %s", cfg.StartTimeout)
	case <-ctx.Done():
		e.Close()
		return nil, fmt.Errorf("cluster: start embedded etcd: %w", ctx.Err())
	}
}

// Defrag thresholds: defragment once the file is at least minDefragBytes and
// at least half of it is free.
const minDefragBytes = 64 << 20

// maintain defragments the database file when compaction has left enough of
// it free, until ctx ends (Close ends it).
func (s *Server) maintain(ctx context.Context, every time.Duration) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return
	}
	defer cli.Close()
	for lifecycle.Sleep(ctx, every) == nil {
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

// Stopped returns a channel that is closed once etcd has stopped: after
// Close, or by itself, when the member was removed from its cluster.
func (s *Server) Stopped() <-chan struct{} { return s.etcd.Server.StopNotify() }

// Name returns the member's name.
func (s *Server) Name() string { return s.name }

// MemberID returns the member's id in its cluster.
func (s *Server) MemberID() uint64 { return uint64(s.etcd.Server.MemberID()) }

// Members returns how many members the cluster has, learners included, as
// this member last saw it.
func (s *Server) Members() int { return len(s.etcd.Server.Cluster().Members()) }

// Close stops the server, in this order: it ends the maintenance goroutine
// (a defragmentation under way is cancelled), stops accepting clients,
// closes open client connections and watches, then syncs and closes the
// data files, and releases the data dir's lock. It is safe to call more
// than once; ctx bounds the wait for the maintenance goroutine, and if it
// ends first the server is closed anyway and the error says so.
func (s *Server) Close(ctx context.Context) error {
	var err error
	s.closeOnce.Do(func() {
		err = s.maintenance.Stop(ctx)
		// etcd reports its own listeners closing as errors; on purpose
		// they are not.
		s.logLevel.SetLevel(zap.FatalLevel)
		s.etcd.Close()
		if s.unlock != nil {
			s.unlock()
		}
	})
	if err != nil {
		return fmt.Errorf("cluster: close %s: %w", s.name, err)
	}
	return nil
}

// FreeLoopbackAddr returns a 127.0.0.1 host:port that was free a moment ago,
// for servers that must be told their port before they listen (etcd's peer
// and client URLs). Another process may take it in between; callers retry or
// fail. It never returns the same address twice in a process: the kernel
// may find the same free port twice in a row, and a server's client and
// peer URLs then got the same port.
func FreeLoopbackAddr() (string, error) {
	handedMu.Lock()
	defer handedMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", fmt.Errorf("cluster: find a free loopback port: %w", err)
		}
		addr := l.Addr().String()
		_ = l.Close()
		if !handed[addr] {
			handed[addr] = true
			return addr, nil
		}
	}
	return "", errors.New("cluster: find a free loopback port: 100 tries found only ports handed out before")
}

// handed are the addresses FreeLoopbackAddr returned.
var (
	handedMu sync.Mutex
	handed   = map[string]bool{}
)

// exists says whether path exists (or cannot be checked: then it is left
// alone).
func exists(path string) bool {
	_, err := os.Stat(path)
	return !errors.Is(err, os.ErrNotExist)
}
