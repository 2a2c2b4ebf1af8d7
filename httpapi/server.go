package httpapi

import (
	"github.com/droverhq/drover/paxos/client"

	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/droverhq/drover"
	"github.com/droverhq/drover/agentserver"
	"github.com/droverhq/drover/budget"
	"github.com/droverhq/drover/internal/buildinfo"
	"github.com/droverhq/drover/internal/serverclose"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/queue"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/tracing/otelspan"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// DefaultMaxBodyBytes is the largest request body the API reads, unless a
// route says otherwise (submissions take more): larger ones get 413.
const DefaultMaxBodyBytes = 1 << 20

// MaxSubmitBytes is the largest body of a queue submission.
const MaxSubmitBytes = 64 << 20

// DefaultRequestTimeout is the time a request may take when Config says
// none: etcd answers within milliseconds when it is well, and /readyz
// gives up after 2 s.
const DefaultRequestTimeout = 5 * time.Second

// MinRequestTimeout is the shortest RequestTimeout: etcd's own round trip
// under load, with a margin; a shorter one would fail requests on a
// healthy etcd, and have the stall probes call it stalled.
const MinRequestTimeout = 100 * time.Millisecond

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
	// RequestTimeout bounds the time the server spends on a request: when
	// etcd does not answer within it, the request gets a 503 with
	// Retry-After, whether or not its client would wait longer. Long polls
	// get it on top of MaxWait, and bulk routes (large bodies, dead-letter
	// requeues and purges, thread deletions, the list of every checkpoint)
	// two minutes more; both end sooner when two probes of etcd in a row,
	// one per RequestTimeout (at most one per 500ms) while they run, get
	// no answer within it. A stream gets it until it starts, then lasts as
	// long as its client. Default DefaultRequestTimeout; at least
	// MinRequestTimeout.
	RequestTimeout time.Duration
	// StatsInterval is how often the queues' counts are sampled for GET
	// /v1/stats/history, which keeps an hour of samples; default
	// DefaultStatsInterval.
	StatsInterval time.Duration
	// PaxosEndpoints are the API addresses (host:port) of a Paxos lock
	// service group to show at GET /v1/paxos; none means the server knows
	// no group, and says so.
	PaxosEndpoints []string
	// TracerProvider makes a span per request (otelhttp, named after the
	// route) under the caller's traceparent, which a submission stores
	// with its tasks; nil means the global provider, a no-op unless set
	// (package tracing). A server that does not trace ignores the
	// traceparent header, and costs nothing per request; a task's own
	// traceparent field is stored either way. The health checks make no
	// span.
	TracerProvider trace.TracerProvider
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
	if c.RequestTimeout == 0 {
		c.RequestTimeout = DefaultRequestTimeout
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
	if c.RequestTimeout < 0 || (c.RequestTimeout > 0 && c.RequestTimeout < MinRequestTimeout) {
		return &drover.InputError{Field: "RequestTimeout", Value: c.RequestTimeout, Rule: "must be 0 (5 s), or 100ms or more"}
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
	// fences caches the locks verified held for fenced checkpoint writes
	// (see fenceCache).
	fences fenceCache
	// streamClaims caches the claims of stream appends and of Agent
	// Server runs, shared by the stream route and the Agent Server's run
	// start and outcome (see appendStream, stream.ClaimCache).
	streamClaims stream.ClaimCache
	// queueClients keeps a queue client per namespace (queueclients.go).
	queueClients queueClientCache
	// hub samples the queues for the history and the event stream (hub.go).
	hub *hub
	// paxos asks the Paxos group of Config.PaxosEndpoints; nil without.
	paxos *client.Client
	// locks sends the sessions' lock acquisitions and releases that arrive
	// together in fewer etcd requests (lock.Batcher).
	locks *lock.Batcher
	// routeKinds says which routes are long polls and streams (bound).
	routeKinds routeKinds
	// stalls ends long requests once etcd stops answering (bound).
	stalls *stallWatch
	// crossOrigin refuses browsers' writes from other origins (serveHTTP).
	crossOrigin *http.CrossOriginProtection

	life    sync.Mutex
	srv     *http.Server
	closed  bool
	serving chan struct{}
	// cascades scans the cancel cascades left in each namespace served
	// (cascadeScans).
	cascades cascadeScans
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
	s := &Server{cfg: cfg, cli: cfg.Etcd, mux: http.NewServeMux(), metrics: m, locks: lock.NewBatcher(cfg.Etcd),
		crossOrigin: http.NewCrossOriginProtection()}
	s.hub = newHub(s, cfg.StatsInterval)
	probeKey := keyspace.MustNew(cfg.Namespace).StoreFull()
	s.stalls = newStallWatch(func(ctx context.Context) error {
		_, err := cfg.Etcd.Get(ctx, probeKey, clientv3.WithCountOnly())
		return err
	}, cfg.RequestTimeout)
	if len(cfg.PaxosEndpoints) > 0 {
		if s.paxos, err = client.New(client.Config{Endpoints: cfg.PaxosEndpoints}); err != nil {
			return nil, drover.Rename(err, "PaxosEndpoints")
		}
	}
	s.api = humago.New(s.mux, apiConfig())
	s.api.UseMiddleware(s.observe, s.authorize, s.bound)
	s.routes()
	// LangGraph's Agent Server API, at the root as LangGraph serves it.
	if err := agentserver.Register(s.api, agentserver.Config{Etcd: cfg.Etcd, Namespace: s.nsOf, LockThread: s.lockForRun, Claims: &s.streamClaims,
		Truncate: os.Getenv(agentserver.TruncateEnv) == "1", ReadOnly: func(op *huma.Operation) { op.Metadata["role"] = RoleRead }}); err != nil {
		return nil, err
	}
	if err := budget.Register(s.api, budget.HTTPConfig{Etcd: cfg.Etcd, Namespace: s.nsOf, Admin: func(op *huma.Operation) { op.Metadata["role"] = RoleAdmin }}); err != nil {
		return nil, err
	}
	s.mountUI()
	s.handler = traced(http.HandlerFunc(s.serveHTTP), cfg.TracerProvider)
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
	s.signalRoutes()
	s.checkpointRoutes()
	s.flowRoutes()
	s.registryRoutes()
	s.dashboardRoutes()
	s.scheduleRoutes()
	s.streamRoutes()
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
		ReadTimeout:       bulkAllowance, // a slow client's body (submissions take up to 64 MiB)
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
	}
	serverclose.Watch(s.srv) // streams that start while it shuts down still end
	s.serving = make(chan struct{})
	srv, serving := s.srv, s.serving
	s.life.Unlock()
	s.scanCascades(s.cfg.Namespace)
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
	defer s.cascades.stopAll()
	defer s.hub.close()
	defer s.stalls.close()
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

// cascadeScans are the scans of the cancel cascades left in each
// namespace the server serves: the processes that began a cascade and
// died leave a mark that some live process must finish (see
// queue.Client.ScanCascades), and a queue whose workers all work over HTTP
// has no worker in process to do it. A namespace's scan starts when the
// server starts (its --namespace) or first serves a queue request of it
// (a token's namespace, or any with "*"), so a namespace whose HTTP
// workers come back after a restart has its left cascades finished; at
// most queueClientsMax namespaces are scanned. Scanners claim each mark,
// so of several servers one runs each cascade.
type cascadeScans struct {
	mu      sync.Mutex
	stopped bool
	stops   map[string]func()
}

// scanCascades starts the scan of ns's cascades unless it runs, the
// server is closed, or queueClientsMax scans run.
func (s *Server) scanCascades(ns string) {
	cs := &s.cascades
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.stopped || cs.stops[ns] != nil || len(cs.stops) >= queueClientsMax {
		return
	}
	c, err := queue.NewClient(s.cli, ns, queue.WithTracerProvider(s.cfg.TracerProvider))
	if err != nil {
		return
	}
	if cs.stops == nil {
		cs.stops = map[string]func(){}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.ScanCascades(ctx, s.cfg.Logger.With("namespace", ns))
		cctx, stop := context.WithTimeout(context.Background(), 5*time.Second)
		defer stop()
		_ = c.Close(cctx)
	}()
	cs.stops[ns] = func() { cancel(); <-done }
}

// stopAll ends every scan and waits for them; no scan starts after it.
func (cs *cascadeScans) stopAll() {
	cs.mu.Lock()
	cs.stopped = true
	stops := cs.stops
	cs.stops = nil
	cs.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
}

// serveHTTP serves a request: a browser's write from another origin is
// refused (see refuseCrossOrigin), a JSON body sent as a form (curl's -d)
// is read as the JSON it is, and a request no route takes gets a problem
// document rather than the ServeMux's plain text.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer s.recoverPanic(w, r)
	if err := s.crossOrigin.Check(r); err != nil {
		s.refuseCrossOrigin(w, r, start)
		return
	}
	if formEncoded(r.Header.Get("Content-Type")) {
		r = r.Clone(r.Context())
		r.Header.Set("Content-Type", "application/json")
	}
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		s.unrouted(w, r, h, start)
		return
	}
	if span := trace.SpanFromContext(r.Context()); span.IsRecording() {
		_, route, _ := strings.Cut(pattern, " ")
		span.SetName(pattern) // "METHOD /route", as the HTTP conventions name server spans
		span.SetAttributes(semconv.HTTPRoute(route))
	}
	s.mux.ServeHTTP(w, r)
}

// traced wraps h in otelhttp: a server span per request, child of the
// request's W3C traceparent, from tp (nil: the global provider); no span
// for the health checks, and no OpenTelemetry metrics (the Prometheus
// ones count requests). While tp does not trace (a no-op provider, or no
// global one set yet, which is checked per request) a request goes to h
// as it came: no otelhttp, no allocation, and its traceparent header is
// not read, so that a server that does not trace stores no trace context
// an older worker could not read (docs/observability.md, "Upgrading").
func traced(h http.Handler, tp trace.TracerProvider) http.Handler {
	tr, global := otelspan.Tracer(tp), tp == nil
	if !global && !otelspan.On(tr) {
		return h
	}
	if global {
		tp = otel.GetTracerProvider() // delegates to the provider set later
	}
	oh := otelhttp.NewHandler(h, "drover", otelhttp.WithTracerProvider(tp),
		otelhttp.WithPropagators(propagation.TraceContext{}), otelhttp.WithMeterProvider(metricnoop.NewMeterProvider()),
		otelhttp.WithFilter(func(r *http.Request) bool { return r.URL.Path != "/healthz" && r.URL.Path != "/readyz" }))
	if !global {
		return oh
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if otelspan.On(tr) {
			oh.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// recoverPanic answers a request whose handler panicked with a 500
// problem, and logs the panic with its stack, rather than leaving the
// client a reset connection. Deferred by serveHTTP.
func (s *Server) recoverPanic(w http.ResponseWriter, r *http.Request) {
	v := recover()
	if v == nil || v == http.ErrAbortHandler {
		if v != nil {
			panic(v)
		}
		return
	}
	s.cfg.Logger.Error("httpapi: a handler panicked", "method", r.Method, "path", redactPath(r.URL.Path), "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
	p := newProblem(http.StatusInternalServerError, "internal", fmt.Sprintf("%s %s: the server failed on this request; its log says why", r.Method, redactPath(r.URL.Path)))
	p.Instance = redactPath(r.URL.Path)
	writeProblemTo(w, p)
}

// refuseCrossOrigin answers a browser's write (any method but GET, HEAD
// and OPTIONS) sent from a page of another origin, as its Sec-Fetch-Site
// or Origin header says: 403. A form post needs no CORS preflight, and
// the API reads forms as JSON, so without this any web page could write
// to a server without auth from its visitors' browsers. Requests without
// those headers (curl, the clients) and the dashboard's own (same origin)
// are not refused.
func (s *Server) refuseCrossOrigin(w http.ResponseWriter, r *http.Request, start time.Time) {
	p := newProblem(http.StatusForbidden, "cross-origin",
		fmt.Sprintf("%s %s: a browser sent this write from a page of another origin (Origin %q, Sec-Fetch-Site %q), and the API takes writes only from its own origin (the dashboard) or from clients that are not browsers",
			r.Method, redactPath(r.URL.Path), r.Header.Get("Origin"), r.Header.Get("Sec-Fetch-Site")))
	p.Instance = redactPath(r.URL.Path)
	writeProblemTo(w, p)
	s.logRequest(r.Method, "", r.URL.Path, p.Status, time.Since(start), r.RemoteAddr, s.unauthorized(r.Header.Get(NamespaceHeader)))
}

// formEncoded reports a body that says it is a form: what curl -d sends
// unless told otherwise. No route takes forms, so it is read as JSON.
func formEncoded(ct string) bool {
	mt, _, _ := strings.Cut(ct, ";")
	return strings.EqualFold(strings.TrimSpace(mt), "application/x-www-form-urlencoded")
}

// unrouted answers a request that matches no route: 405 with Allow when
// the path has routes for other methods, else 404. h is the ServeMux's
// own answer, asked only for its status and Allow header.
func (s *Server) unrouted(w http.ResponseWriter, r *http.Request, h http.Handler, start time.Time) {
	rec := &statusRecorder{header: http.Header{}}
	h.ServeHTTP(rec, r)
	var p *Problem
	if allow := rec.header.Get("Allow"); rec.code == http.StatusMethodNotAllowed {
		p = newProblem(http.StatusMethodNotAllowed, "method-not-allowed",
			fmt.Sprintf("%s %s: this path takes %s; the OpenAPI document at /openapi.json describes every route", r.Method, redactPath(r.URL.Path), allow))
		p.headers = http.Header{"Allow": {allow}}
	} else {
		p = newProblem(http.StatusNotFound, "no-route",
			fmt.Sprintf("no route %s %s: the API's routes are under /v1 (the OpenAPI document at /openapi.json describes them), the dashboard at /ui/", r.Method, redactPath(r.URL.Path)))
	}
	p.Instance = redactPath(r.URL.Path)
	writeProblemTo(w, p)
	s.logRequest(r.Method, "", r.URL.Path, p.Status, time.Since(start), r.RemoteAddr, s.unauthorized(r.Header.Get(NamespaceHeader)))
}

// statusRecorder keeps the status and headers a handler writes, and
// drops its body.
type statusRecorder struct {
	header http.Header
	code   int
}

func (r *statusRecorder) Header() http.Header { return r.header }

func (r *statusRecorder) Write(b []byte) (int, error) {
	if r.code == 0 {
		r.code = http.StatusOK
	}
	return len(b), nil
}

func (r *statusRecorder) WriteHeader(code int) {
	if r.code == 0 {
		r.code = code
	}
}

// writeProblemTo writes p as the answer.
func writeProblemTo(w http.ResponseWriter, p *Problem) {
	for k, vs := range p.headers {
		for _, v := range vs {
			w.Header().Add(k, v)
		}
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(p.Status)
	_ = json.NewEncoder(w).Encode(p)
}
