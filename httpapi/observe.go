package httpapi

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/danielgtaylor/huma/v2"
	"github.com/droverhq/drover/keyspace"
	"github.com/prometheus/client_golang/prometheus"
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
// path, status, duration, namespace and token name (never the token).
// authorize, which runs inside it, fills in the namespace it served and
// the token's name (see noteAccess).
func (s *Server) observe(ctx huma.Context, next func(huma.Context)) {
	start := time.Now()
	who := &access{ns: ctx.Header(NamespaceHeader)}
	if who.ns == "" {
		who.ns = s.cfg.Namespace
	}
	next(huma.WithValue(ctx, accessKey{}, who))
	op := ctx.Operation()
	code := ctx.Status()
	if code == 0 {
		code = 200
	}
	d := time.Since(start)
	s.metrics.requests.WithLabelValues(op.Path, op.Method, strconv.Itoa(code)).Inc()
	s.metrics.latency.WithLabelValues(op.Path, op.Method).Observe(d.Seconds())
	s.logRequest(op.Method, op.Path, ctx.URL().Path, code, d, ctx.RemoteAddr(), who.ns, who.token)
}

// logRequest writes a request's access log line (a warning for a 5xx).
func (s *Server) logRequest(method, route, path string, code int, d time.Duration, remote, ns, token string) {
	level := s.cfg.Logger.Info
	if code >= 500 {
		level = s.cfg.Logger.Warn
	}
	level("http request", "method", method, "route", route, "path", path, "status", code,
		"duration_ms", float64(d.Microseconds())/1000, "remote", remote, "namespace", ns, "token", token)
}

// access is what the access log says of who made a request and where:
// the namespace it named (or the server's) and its token's name, "" before
// the token is known and "anonymous" on a server without auth.
type access struct{ ns, token string }

type accessKey struct{}

// noteAccess records, for the access log, the token name a request was
// authorized with.
func noteAccess(ctx context.Context, token string) {
	if a, ok := ctx.Value(accessKey{}).(*access); ok {
		a.token = token
	}
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
