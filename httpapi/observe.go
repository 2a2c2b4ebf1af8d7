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
func (s *Server) observe(ctx huma.Context, next func(huma.Context)) {
	start := time.Now()
	next(ctx)
	op := ctx.Operation()
	code := ctx.Status()
	if code == 0 {
		code = 200
	}
	d := time.Since(start)
	s.metrics.requests.WithLabelValues(op.Path, op.Method, strconv.Itoa(code)).Inc()
	s.metrics.latency.WithLabelValues(op.Path, op.Method).Observe(d.Seconds())
	level := s.cfg.Logger.Info
	if code >= 500 {
		level = s.cfg.Logger.Warn
	}
	level("http request", "method", op.Method, "route", op.Path, "path", ctx.URL().Path, "status", code,
		"duration_ms", float64(d.Microseconds())/1000, "remote", ctx.RemoteAddr(),
		"namespace", s.nsOf(ctx.Context()), "token", whoOf(ctx.Context()))
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
