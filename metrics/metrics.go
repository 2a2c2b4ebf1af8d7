// Package metrics holds drover's Prometheus metrics and serves them.
//
// Every family is registered in [Registry] (with the Go runtime and process
// collectors) under the drover_ prefix. Workers, the server and the flow
// controls update them; `drover worker --metrics-listen` and `drover server
// --metrics-listen` serve them with [Serve].
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry holds every drover metric of this process.
var Registry = prometheus.NewRegistry()

// Tasks by queue and task type.
var (
	TasksClaimed   = counter("drover_tasks_claimed_total", "Tasks claimed by this process's workers.", "queue", "type")
	TasksSucceeded = counter("drover_tasks_succeeded_total", "Task attempts that succeeded.", "queue", "type")
	TasksFailed    = counter("drover_tasks_failed_total", "Task attempts that failed (retried or dead).", "queue", "type")
	TasksRetried   = counter("drover_tasks_retried_total", "Failed task attempts scheduled for a retry.", "queue", "type")
	TasksDead      = counter("drover_tasks_dead_total", "Tasks moved to the dead-letter queue.", "queue", "type")
	TasksDeferred  = counter("drover_tasks_deferred_total", "Tasks handed back for later by flow control (quota, breaker), not charged a retry.", "queue", "type", "reason")
	// HandlersAbandoned counts handlers a worker gave up waiting for:
	// their context ended and they did not return within the worker's
	// shutdown timeout. Their slot was freed and their late result is
	// discarded; HandlersStuck is how many of them still run.
	HandlersAbandoned = counter("drover_handlers_abandoned_total", "Handlers a worker gave up waiting for: their context ended and they did not return within the shutdown timeout (their slot is freed, their late result discarded).", "queue", "type")
	HandlersStuck     = gauge("drover_handlers_stuck", "Abandoned handlers of this process that have not returned yet (goroutines still running).", "queue")
	// SegmentsQuarantined counts segments whose value could not be
	// decoded: moved aside to the queue's quarantine keys, out of claims.
	SegmentsQuarantined = counter("drover_segments_quarantined_total", "Segments whose value could not be decoded, moved to the queue's quarantine keys so that claims go on.", "queue")
	// SegmentsUnknownFormat counts segments of a format this process
	// does not know (a newer drover wrote them): skipped, not quarantined.
	SegmentsUnknownFormat = counter("drover_segments_unknown_format_total", "Segments of a format this process does not know (written by a newer drover), skipped by its claims and left for a worker that knows it; counted once per segment and worker.", "queue")
	TaskDuration          = histogram("drover_task_duration_seconds", "Time a task's handler ran.", prometheus.ExponentialBuckets(0.001, 4, 10), "queue", "type", "outcome")
	QueueTasks            = gauge("drover_queue_tasks", "Tasks in a queue by state, as a worker (--depth-interval) or the server (every stats interval) last counted them.", "queue", "state")
	QueuePaused           = gauge("drover_queue_paused", "1 while a queue is paused (no claim of its tasks commits), 0 once resumed, as a worker (for its queue) or the server (for its own namespace) last saw it.", "queue")
	ClaimBatchSize        = histogram("drover_claim_batch_size", "Tasks claimed per claim transaction.", []float64{1, 2, 4, 8, 16, 32, 64, 100}, "queue")
)

// Each queue's history, as the server counts it from the keys the queue
// writes (package internal/qstats): every server of a cluster counts every
// queue, so aggregate across servers with max, not sum.
var (
	QueueProcessed    = counter("drover_queue_processed_total", "Tasks of a queue that succeeded, as this server saw them written (any worker).", "queue")
	QueueFailed       = counter("drover_queue_failed_total", "Tasks of a queue that failed for good (moved to the dead-letter queue), as this server saw them written.", "queue")
	QueueRetried      = counter("drover_queue_retried_total", "Failed attempts of a queue's tasks scheduled for a retry, as this server saw them written.", "queue")
	QueueDeferred     = counter("drover_queue_deferred_total", "Tasks of a queue handed back by flow control (quota, breaker), as this server saw them written.", "queue")
	QueueStartLatency = histogram("drover_queue_start_latency_seconds", "Time from a task's submission (or due time) to its first claim.", prometheus.ExponentialBuckets(0.005, 2, 18), "queue")
)

// Coordination costs.
var (
	LeaseLosses     = plainCounter("drover_lease_losses_total", "Leases lost (renewal deadline passed or lease gone).")
	DueMoves        = counter("drover_due_moves_total", "Requests of a due index that moved items, by index and result (moved, lost: another mover moved some first, refused: moved one by one instead).", "index", "result")
	DueErrors       = counter("drover_due_errors_total", "Failures of a due index's moves or watch (each followed by a new try), by index.", "index")
	EtcdTxnDuration = histogram("drover_etcd_txn_duration_seconds", "Latency of drover's etcd transactions by purpose.", prometheus.ExponentialBuckets(0.0002, 2, 14), "op")
)

// Flow control.
var (
	RateLimitWaitSeconds = counter("drover_ratelimit_wait_seconds_total", "Time tasks waited for rate-limit tokens.", "limit")
	RateLimitWaits       = counter("drover_ratelimit_waits_total", "Times a task had to wait for rate-limit tokens.", "limit")
	RateLimitTokensUsed  = counter("drover_ratelimit_tokens_used_total", "Rate-limit tokens used (settled weight).", "limit")
	QuotaWaits           = counter("drover_quota_waits_total", "Tasks deferred because a concurrency quota was full.", "quota")
	BreakerState         = gauge("drover_breaker_state", "Circuit breaker state: 0 closed, 1 half-open, 2 open.", "breaker")
)

// LLM budgets (package budget), as this process reserved and settled them.
var (
	BudgetReservations  = counter("drover_budget_reservations_total", "Reservations of an LLM budget by outcome: admitted, or refused for now (deferred).", "budget", "outcome")
	BudgetTokensSettled = counter("drover_budget_tokens_settled_total", "Tokens settled against an LLM budget: what the calls used.", "budget")
	BudgetTaskDeferrals = counter("drover_budget_task_deferrals_total", "Queue tasks a worker's budget gate handed back unrun (attempt not counted) to wait for their budget.", "budget")
)

func init() {
	Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
}

func counter(name, help string, labels ...string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	Registry.MustRegister(c)
	return c
}

func plainCounter(name, help string) prometheus.Counter {
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	Registry.MustRegister(c)
	return c
}

func gauge(name, help string, labels ...string) *prometheus.GaugeVec {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	Registry.MustRegister(g)
	return g
}

func histogram(name, help string, buckets []float64, labels ...string) *prometheus.HistogramVec {
	h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets}, labels)
	Registry.MustRegister(h)
	return h
}

// ObserveTxn records how long an etcd transaction for op took, from start.
func ObserveTxn(op string, start time.Time) {
	EtcdTxnDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

// Handler serves Registry, and extra registries (etcd's own metrics, say)
// after it.
func Handler(extra ...prometheus.Gatherer) http.Handler {
	g := prometheus.Gatherers(append([]prometheus.Gatherer{Registry}, extra...))
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError, EnableOpenMetrics: true})
}

// Listen opens addr for Serve, so that a bad address fails before anything
// else starts.
func Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w (choose a free host:port for --metrics-listen)", addr, err)
	}
	return l, nil
}

// Serve serves /metrics, and Go's profiles under /debug/pprof/, on l until
// ctx ends. Bind it to a loopback or otherwise private address.
func Serve(ctx context.Context, l net.Listener, logger *slog.Logger, extra ...prometheus.Gatherer) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", Handler(extra...))
	// Profiles for the on-call engineer: go tool pprof http://ADDR/debug/pprof/profile
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	served, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		select {
		case <-ctx.Done():
		case <-served:
			return
		}
		// Requests in flight (a CPU profile takes its seconds) get 2 s,
		// then their connections are closed: Serve returns only once
		// nothing of the server runs.
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(sctx) != nil {
			_ = srv.Close()
		}
	}()
	logger.Info("serving metrics", "url", "http://"+l.Addr().String()+"/metrics")
	err := srv.Serve(l)
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		close(served)
		<-stopped
		return fmt.Errorf("metrics: %w", err)
	}
	<-stopped
	return nil
}
