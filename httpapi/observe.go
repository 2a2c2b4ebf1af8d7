package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/danielgtaylor/huma/v2/adapters/humago"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/tracing/otelspan"
	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc/codes"
)

// requestMetrics are the API's Prometheus metrics: requests by route,
// method and status code, and their latency.
type requestMetrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newRequestMetrics(reg prometheus.Registerer) (*requestMetrics, error) {
	m := &requestMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "drover_http_requests_total",
			Help: "HTTP API requests, by route, method and status code.",
		}, []string{"route", "method", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "drover_http_request_duration_seconds",
			Help:    "HTTP API request latency (long polls and streams included), by route and method.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 10, 60},
		}, []string{"route", "method"}),
	}
	var err error
	if m.requests, err = register(reg, m.requests); err != nil {
		return nil, err
	}
	if m.latency, err = register(reg, m.latency); err != nil {
		return nil, err
	}
	return m, nil
}

// register registers c, or returns the collector already registered under
// its name (a second server in the same process).
func register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	return c, err
}

// observe counts and times every request, and logs it: method, route,
// path (session ids without their secret), status, duration, namespace
// and token name (never the token). authorize, which runs inside it, says
// whether the request was allowed its namespace and fills in the token's
// name (see noteAccess).
func (s *Server) observe(ctx huma.Context, next func(huma.Context)) {
	start := time.Now()
	who := s.unauthorized(ctx.Header(NamespaceHeader))
	next(huma.WithValue(ctx, accessKey{}, who))
	op := ctx.Operation()
	code := ctx.Status()
	if code == 0 {
		code = 200
	}
	d := time.Since(start)
	s.metrics.requests.WithLabelValues(op.Path, op.Method, strconv.Itoa(code)).Inc()
	otelspan.Observe(ctx.Context(), s.metrics.latency.WithLabelValues(op.Path, op.Method), d.Seconds())
	s.logRequest(op.Method, op.Path, ctx.URL().Path, code, d, ctx.RemoteAddr(), who)
}

// logRequest writes a request's access log line (a warning for a 5xx).
// path is logged without the secrets of session ids (redactPath).
func (s *Server) logRequest(method, route, path string, code int, d time.Duration, remote string, who *access) {
	level := s.cfg.Logger.Info
	if code >= 500 {
		level = s.cfg.Logger.Warn
	}
	level("http request", "method", method, "route", route, "path", redactPath(path), "status", code,
		"duration_ms", float64(d.Microseconds())/1000, "remote", remote,
		"namespace", who.ns, "namespace_allowed", who.allowed, "token", who.token)
}

// access is what the access log says of who made a request and where.
type access struct {
	// ns is the namespace the request named (or the server's); "" when
	// it is no valid namespace name.
	ns string
	// allowed says the request was authorized to use ns: false on a 401,
	// a 403 for the namespace, a public route, or GET /v1/whoami of a
	// namespace the token may not use.
	allowed bool
	// token is the token's name: "" before it is known, "anonymous" on a
	// server without auth.
	token string
}

type accessKey struct{}

// unauthorized is the access of a request naming namespace header
// ("" names the server's), before it is authorized.
func (s *Server) unauthorized(header string) *access {
	ns := header
	if ns == "" {
		ns = s.cfg.Namespace
	}
	if !validNamespace(ns) {
		ns = ""
	}
	return &access{ns: ns}
}

// noteAccess records, for the access log, the token name a request was
// authorized with, and whether it may use the namespace it named.
func noteAccess(ctx context.Context, token string, allowed bool) {
	if a, ok := ctx.Value(accessKey{}).(*access); ok {
		a.token, a.allowed = token, allowed
	}
}

// redactPath is a request's path as logs and problems show it: a session
// id (the segment after /v1/sessions/, and any segment that looks like
// one) without its secret.
func redactPath(p string) string {
	segs := strings.Split(p, "/")
	for i, seg := range segs {
		if i == 3 && segs[1] == "v1" && segs[2] == "sessions" {
			segs[i] = redactAny(seg)
		} else if looksLikeSession(seg) {
			segs[i] = redact(seg)
		}
	}
	return strings.Join(segs, "/")
}

// redactAny shows what stands for a session id without its secret: the
// lease part of an id, "…" for anything without one.
func redactAny(v string) string {
	if _, _, ok := strings.Cut(v, "."); ok {
		return redact(v)
	}
	return "…"
}

// looksLikeSession reports a value that may be a session id, even a
// mistyped one: a dot followed by 16 or more characters of a secret's
// alphabet (base32: letters and the digits 2 to 7).
func looksLikeSession(v string) bool {
	_, secret, ok := strings.Cut(v, ".")
	if !ok || len(secret) < 16 {
		return false
	}
	for _, c := range secret[:16] {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '2' <= c && c <= '7') {
			return false
		}
	}
	return true
}

// nsOf is the namespace the request was authorized for.
func (s *Server) nsOf(ctx context.Context) string {
	if ns, ok := ctx.Value(nsKey).(string); ok {
		return ns
	}
	return s.cfg.Namespace
}

// keys is the request's key space.
func (s *Server) keys(ctx context.Context) keyspace.Space { return keyspace.MustNew(s.nsOf(ctx)) }

func whoOf(ctx context.Context) string {
	w, _ := ctx.Value(whoKey).(string)
	return w
}

// bound gives the request its time bound (Config.RequestTimeout): past
// it, the etcd calls under way fail and the request answers 503 with
// Retry-After. Long polls get MaxWait more and bulk routes bulkAllowance
// more; both end sooner when etcd stops answering meanwhile (see
// stallWatch). A stream is bounded until it starts streaming (see
// startStream).
func (s *Server) bound(ctx huma.Context, next func(huma.Context)) {
	op := ctx.Operation()
	d := s.cfg.RequestTimeout
	kind := s.routeKinds.of(s.api, op)
	if kind.longPoll {
		d += s.cfg.MaxWait
	}
	if kind.bulk {
		d += bulkAllowance
	}
	parent := ctx.Context()
	c, cancel := context.WithTimeoutCause(parent, d, errRequestTimeout)
	defer cancel()
	if kind.longPoll || kind.bulk {
		var stop context.CancelCauseFunc
		c, stop = context.WithCancelCause(c)
		defer stop(nil)
		defer s.stalls.watch(stop)()
	}
	if kind.stream {
		c = context.WithValue(c, unboundKey{}, parent)
	}
	next(huma.WithContext(ctx, c))
}

// errEtcdStalled is the cause of a long request's end when etcd stopped
// answering while it ran.
var errEtcdStalled = fmt.Errorf("etcd did not answer a probe within the server's request timeout: %w", context.DeadlineExceeded)

// stallWatch ends the long requests under way (long polls, bulk routes)
// once etcd stops answering, rather than at the end of their longer
// bounds: while any runs, it reads one key every request timeout (at most
// one read per minProbeEvery), and stallProbes reads in a row that get no
// answer within it (see stallCount) cancel them all.
type stallWatch struct {
	probe func(ctx context.Context) error
	every time.Duration

	mu      sync.Mutex
	seq     int
	reqs    map[int]context.CancelCauseFunc
	running bool
	closed  chan struct{}
}

func newStallWatch(probe func(ctx context.Context) error, every time.Duration) *stallWatch {
	return &stallWatch{probe: probe, every: every, reqs: map[int]context.CancelCauseFunc{}, closed: make(chan struct{})}
}

// watch cancels with stop when etcd stalls, until the returned func is
// called.
func (w *stallWatch) watch(stop context.CancelCauseFunc) (done func()) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.seq++
	id := w.seq
	w.reqs[id] = stop
	if !w.running {
		w.running = true
		go w.run()
	}
	return func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		delete(w.reqs, id)
	}
}

// run probes etcd while requests are watched; it returns when none is,
// or when the server closes.
func (w *stallWatch) run() {
	var count stallCount
	t := time.NewTimer(max(w.every, minProbeEvery))
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-w.closed:
			w.mu.Lock()
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Lock()
		if len(w.reqs) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), w.every)
		err := w.probe(ctx)
		cancel()
		if count.note(err) {
			w.mu.Lock()
			for _, stop := range w.reqs {
				stop(errEtcdStalled)
			}
			w.mu.Unlock()
		}
		t.Reset(max(w.every, minProbeEvery))
	}
}

// minProbeEvery is the shortest time between two probes of a stallWatch.
const minProbeEvery = 500 * time.Millisecond

// stallProbes is how many probes in a row must go unanswered for etcd to
// be called stalled: one late answer (a slow fsync, a compaction) does
// not end every long request.
const stallProbes = 2

// stallCount counts the probes in a row that etcd did not answer.
type stallCount struct{ n int }

// note counts a probe's outcome and reports whether etcd is stalled. Only
// an etcd that did not answer counts (deadline exceeded, unavailable);
// any answer, an error such as permission denied or a leader change
// included, says etcd is there and starts the count again.
func (c *stallCount) note(err error) (stalled bool) {
	if !unanswered(err) {
		c.n = 0
		return false
	}
	c.n++
	return c.n >= stallProbes
}

// unanswered reports a probe's error that says etcd did not answer.
func unanswered(err error) bool {
	switch {
	case err == nil, errors.Is(err, rpctypes.ErrLeaderChanged), errors.Is(err, rpctypes.ErrGRPCLeaderChanged):
		return false
	}
	return errors.Is(err, context.DeadlineExceeded) || etcdCode(err) == codes.DeadlineExceeded || isUnavailable(err)
}

// close stops the probes.
func (w *stallWatch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.closed:
	default:
		close(w.closed)
	}
}

// errRequestTimeout is the cause of a request's end at its time bound.
var errRequestTimeout = fmt.Errorf("the request took longer than the server's request timeout: %w", context.DeadlineExceeded)

// beforeStream, when set (by tests), runs as a stream starts, before it
// checks its time bound.
var beforeStream atomic.Pointer[func(ctx context.Context)]

// unboundKey holds a stream's context without its time bound.
type unboundKey struct{}

// startStream begins a stream's answer once its setup (its first etcd
// reads) is done within the request's time bound: it returns the context
// the stream runs under, which lasts as long as its client (keepalives find
// a client that left), and the writer to stream to. When the bound passed
// before, it answers 503 and returns false.
func startStream(hctx huma.Context) (context.Context, http.ResponseWriter, bool) {
	_, w := humago.Unwrap(hctx)
	ctx := hctx.Context()
	if hook := beforeStream.Load(); hook != nil {
		(*hook)(ctx)
	}
	if ctx.Err() != nil {
		var p *Problem
		if errors.As(problem(context.Cause(ctx), nil), &p) {
			writeProblem(hctx, p) // through hctx: the access log and metrics see its status
		}
		return nil, nil, false
	}
	if parent, ok := ctx.Value(unboundKey{}).(context.Context); ok {
		ctx = parent
	}
	return ctx, w, true
}

// routeKind says how a route is bounded in time.
type routeKind struct {
	longPoll bool // takes a wait (query.wait, body.wait, body.claim.wait)
	stream   bool // answers text/event-stream
	bulk     bool // takes a large body, or works through a whole queue or thread
}

// bulkAllowance is the time a bulk route gets beyond the request timeout:
// as long as the server lets a body take to arrive (http.Server's
// ReadTimeout, and the BodyReadTimeout of the bulk routes whose bodies
// huma reads), since the route's work is in proportion to it.
const bulkAllowance = 2 * time.Minute

// bulkRoutes are the routes whose work is in proportion to what is stored
// rather than to the request: a dead-letter queue's requeue and purge,
// the run-now of every scheduled task of a queue, a
// thread's deletion, the list of every thread's checkpoints. Routes that
// take bodies over DefaultMaxBodyBytes (submissions, checkpoints, steps)
// are bulk routes too.
var bulkRoutes = map[string]bool{"requeue-dead-tasks": true, "run-scheduled-tasks-now": true, "purge-dead-tasks": true, "delete-thread": true, "list-all-checkpoints": true}

// routeKinds caches each operation's routeKind, read from its OpenAPI
// description: a route that takes a wait is a long poll, one that answers
// text/event-stream a stream.
type routeKinds struct{ m sync.Map }

func (k *routeKinds) of(api huma.API, op *huma.Operation) routeKind {
	if v, ok := k.m.Load(op); ok {
		return v.(routeKind)
	}
	rk := routeKind{bulk: bulkRoutes[op.OperationID] || op.MaxBodyBytes > DefaultMaxBodyBytes}
	for _, p := range op.Parameters {
		rk.longPoll = rk.longPoll || (p.In == "query" && p.Name == "wait")
	}
	if op.RequestBody != nil {
		for _, mt := range op.RequestBody.Content {
			rk.longPoll = rk.longPoll || takesWait(api.OpenAPI().Components.Schemas, mt.Schema, 2)
		}
	}
	for _, r := range op.Responses {
		if r != nil && r.Content["text/event-stream"] != nil {
			rk.stream = true
		}
	}
	k.m.Store(op, rk)
	return rk
}

// takesWait reports a body schema with a "wait" property, itself or in an
// object property, up to depth levels down.
func takesWait(reg huma.Registry, sc *huma.Schema, depth int) bool {
	if sc != nil && sc.Ref != "" {
		sc = reg.SchemaFromRef(sc.Ref)
	}
	if sc == nil || depth == 0 {
		return false
	}
	if _, ok := sc.Properties["wait"]; ok {
		return true
	}
	for _, p := range sc.Properties {
		if takesWait(reg, p, depth-1) {
			return true
		}
	}
	return false
}
