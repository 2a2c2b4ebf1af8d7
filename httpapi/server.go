package httpapi

import (
	"github.com/droverhq/drover/paxos/client"

	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/internal/buildinfo"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultMaxBodyBytes is the largest request body the API reads, unless a
// route says otherwise (submissions take more): larger ones get 413.
const DefaultMaxBodyBytes = 1 << 20

// MaxSubmitBytes is the largest body of a queue submission.
const MaxSubmitBytes = 64 << 20

// Config configures a [Server]. Only Etcd is required.
type Config struct {
	// Etcd is the client every request goes through; the caller closes it
	// after the server.
	Etcd *clientv3.Client
	// Namespace is the namespace of requests that name none (no
	// Drover-Namespace header); "" means "drover".
	Namespace string
	// Auth, when set, requires a bearer token on every route but the
	// health checks (see [LoadAuth]); nil serves without authentication.
	Auth *Auth
	// Logger receives one access log line per request (never a token).
	// Default slog.Default().
	Logger *slog.Logger
	// Registerer receives the request metrics; default
	// prometheus.DefaultRegisterer. Metrics already registered there (a
	// second server in one process) are shared.
	Registerer prometheus.Registerer
	// Ready, if set, is asked by /readyz beside etcd's own answer (the
	// store guard's state, for instance): an error makes the server not
	// ready, with the error as the reason.
	Ready func(ctx context.Context) error
	// MaxWait bounds every long poll (claims, lock waits, limit takes).
	// Default 60 s.
	MaxWait time.Duration
	// StatsInterval is how often the queues' counts are sampled for GET
	// /v1/stats/history, which keeps an hour of samples; default
	// DefaultStatsInterval.
	StatsInterval time.Duration
	// PaxosEndpoints are the API addresses (host:port) of a Paxos lock
	// service group to show at GET /v1/paxos; none means the server knows
	// no group, and says so.
	PaxosEndpoints []string
}

func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = keyspace.DefaultNamespace
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.DefaultRegisterer
	}
	if c.MaxWait == 0 {
		c.MaxWait = 60 * time.Second
	}
	if c.StatsInterval == 0 {
		c.StatsInterval = DefaultStatsInterval
	}
	return c
}

// Validate reports the first field that is not usable.
func (c Config) Validate() error {
	if c.Etcd == nil {
		return &drover.InputError{Field: "Etcd", Rule: "must be an etcd client"}
	}
	if _, err := keyspace.New(c.Namespace); c.Namespace != "" && err != nil {
		return drover.Rename(err, "Namespace")
	}
	if c.MaxWait < 0 {
		return &drover.InputError{Field: "MaxWait", Value: c.MaxWait, Rule: "must be 0 (60 s) or positive"}
	}
	if c.StatsInterval < 0 || (c.StatsInterval > 0 && c.StatsInterval < 10*time.Millisecond) || c.StatsInterval > time.Hour {
		return &drover.InputError{Field: "StatsInterval", Value: c.StatsInterval, Rule: "must be 0 (5 s), or from 10ms to 1h"}
	}
	for _, e := range c.PaxosEndpoints {
		if _, err := client.ParseEndpoint(e); err != nil {
			return &drover.InputError{Field: "PaxosEndpoints", Value: e, Rule: "must be host:port of a Paxos node's API"}
		}
	}
	return nil
}

// Server is drover's HTTP API: every capability as JSON routes under /v1,
// described by the OpenAPI document at /openapi.json. It holds no client
// state of its own: sessions, locks, claims and registrations live in etcd,
// so any server in front of the same etcd serves any client.
//
// Serve starts it on a listener and Close stops it; Handler serves it from
// the caller's own http.Server.
type Server struct {
	cfg     Config
	cli     *clientv3.Client
	api     huma.API
	mux     *http.ServeMux
	handler http.Handler
	metrics *requestMetrics
	// sessions caches the records of sessions seen (see Server.session).
	sessions sessionCache
	// queueClients keeps a queue client per namespace (queueclients.go).
	queueClients queueClientCache
	// hub samples the queues for the history and the event stream (hub.go).
	hub *hub
	// paxos asks the Paxos group of Config.PaxosEndpoints; nil without.
	paxos *client.Client
	// locks sends the sessions' lock acquisitions and releases that arrive
	// together in fewer etcd requests (lock.Batcher).
	locks *lock.Batcher

	life    sync.Mutex
	srv     *http.Server
	closed  bool
	serving chan struct{}
}

// New builds the server's routes. It listens on nothing until Serve.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m, err := newRequestMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, cli: cfg.Etcd, mux: http.NewServeMux(), metrics: m, locks: lock.NewBatcher(cfg.Etcd)}
	s.hub = newHub(s, cfg.StatsInterval)
	if len(cfg.PaxosEndpoints) > 0 {
		if s.paxos, err = client.New(client.Config{Endpoints: cfg.PaxosEndpoints}); err != nil {
			return nil, drover.Rename(err, "PaxosEndpoints")
		}
	}
	s.api = humago.New(s.mux, apiConfig())
	s.api.UseMiddleware(s.observe, s.authorize)
	s.routes()
	s.mountUI()
	s.handler = s.mux
	return s, nil
}

// apiConfig is huma's configuration: OpenAPI 3.1 at /openapi.json (and
// .yaml), no documentation page that loads scripts from the internet, no
// "$schema" links in bodies.
func apiConfig() huma.Config {
	c := huma.DefaultConfig("drover", buildinfo.Version)
	c.OpenAPIPath = "/openapi"
	c.DocsPath = ""
	c.CreateHooks = nil
	c.Info.Description = "The coordination plane for fleets of AI agents: sessions, locks with fencing tokens, " +
		"durable queues, agent tasks with steps, checkpoints, flow control and the registry, over JSON. " +
		"Errors are RFC 9457 problem documents."
	c.Components.SecuritySchemes = map[string]*huma.SecurityScheme{
		"bearer": {Type: "http", Scheme: "bearer", Description: "a token of the server's --auth-file"},
	}
	return c
}

// routes registers every route; each capability's file adds its own.
func (s *Server) routes() {
	s.healthRoutes()
	s.sessionRoutes()
	s.lockRoutes()
	s.queueRoutes()
	s.taskRoutes()
	s.checkpointRoutes()
	s.flowRoutes()
	s.registryRoutes()
	s.dashboardRoutes()
}

// Handler returns the server's routes, for an http.Server of the caller's.
func (s *Server) Handler() http.Handler { return s.handler }

// API returns the huma API, for the OpenAPI document and for tests.
func (s *Server) API() huma.API { return s.api }

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("httpapi: server closed")

// Serve serves the API on l until Close, then returns nil. tlsCert and
// tlsKey, when both are set, serve HTTPS. A second Serve while one runs
// returns an error.
func (s *Server) Serve(l net.Listener, tlsCert, tlsKey string) error {
	s.life.Lock()
	if s.closed {
		s.life.Unlock()
		return ErrServerClosed
	}
	if s.srv != nil {
		s.life.Unlock()
		return errors.New("httpapi: already serving")
	}
	s.srv = &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       2 * time.Minute, // a slow client's body (submissions take up to 64 MiB)
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	s.serving = make(chan struct{})
	srv, serving := s.srv, s.serving
	s.life.Unlock()
	s.hub.start()
	defer close(serving)
	var err error
	if tlsCert != "" || tlsKey != "" {
		err = srv.ServeTLS(l, tlsCert, tlsKey)
	} else {
		err = srv.Serve(l)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return fmt.Errorf("httpapi: serve: %w", err)
}

// Close stops accepting requests and waits, no longer than ctx allows, for
// those under way (long polls and streams end with ctx); it is safe to call
// twice and before Serve. Call it too when serving from Handler: it stops
// the goroutine that samples the queues. The order: the listener and the
// requests first (streams end as the shutdown begins), then the sampler.
func (s *Server) Close(ctx context.Context) error {
	s.life.Lock()
	s.closed = true
	srv, serving := s.srv, s.serving
	s.life.Unlock()
	defer s.hub.close()
	if s.paxos != nil {
		defer func() { _ = s.paxos.Close(ctx) }()
	}
	if srv == nil {
		return nil
	}
	err := srv.Shutdown(ctx)
	if err == nil {
		// Every handler has returned, so no claim waits on the queue
		// clients' shared watches: end them and wait for them. After a
		// forced close handlers may still run; their watches then end
		// on their own, ten seconds after their last wait.
		s.queueClients.closeAll(ctx)
	} else {
		_ = srv.Close()
	}
	select {
	case <-serving:
	case <-ctx.Done():
	}
	if err != nil {
		return fmt.Errorf("httpapi: close: %w", err)
	}
	return nil
}
