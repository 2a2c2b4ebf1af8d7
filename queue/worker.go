package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/droverhq/drover"
	"github.com/droverhq/drover/keyspace"
	"github.com/droverhq/drover/lease"
	"github.com/droverhq/drover/lock"
	"github.com/droverhq/drover/metrics"
	"github.com/droverhq/drover/stream"
	"github.com/droverhq/drover/task"
	"github.com/droverhq/drover/tracing/otelspan"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.opentelemetry.io/otel/trace"
)

// Handler runs one task and returns its result. Return an error made with
// Permanent for failures that retrying cannot fix; any other error is
// transient and retried with backoff while the task's budget lasts. ctx ends
// when the task times out, is cancelled, or the worker loses its claim.
type Handler func(ctx context.Context, t *Task) ([]byte, error)

// Errors a handler's context may end with (context.Cause), and the marker of
// permanent failures.
var (
	ErrPermanent = errors.New("queue: permanent failure")
	ErrTimeout   = errors.New("queue: task timed out")
	ErrCancelled = errors.New("queue: task cancelled")
	ErrShutdown  = errors.New("queue: worker shutting down; task handed back")
	// ErrNotRun is what a Gate's done hears when a later gate refused the
	// task: the handler did not run.
	ErrNotRun      = errors.New("queue: task not run: a later gate refused it")
	ErrNoHandler   = errors.New("queue: no handler for the task type")
	ErrResultLarge = errors.New("queue: result too large")
)

// PermanentError wraps a failure that retrying cannot fix.
type PermanentError struct{ Err error }

// Error implements error.
func (e *PermanentError) Error() string { return e.Err.Error() }

// Unwrap returns ErrPermanent and the cause.
func (e *PermanentError) Unwrap() []error { return []error{ErrPermanent, e.Err} }

// Permanent marks err as a permanent failure: the task goes to the
// dead-letter queue without retry.
func Permanent(err error) error { return &PermanentError{Err: err} }

// WorkerConfig configures a Worker. Zero values mean the defaults.
type WorkerConfig struct {
	Namespace string
	Queue     string
	WorkerID  string
	// Concurrency is how many tasks run at once (default 8).
	Concurrency int
	// Prefetch is the most tasks claimed in one transaction (default
	// Concurrency, at most 100). The worker also claims tasks ahead of a
	// free running slot, so that the round trip of the next claim overlaps
	// the work (not in a FIFO queue): up to Prefetch while its tasks take
	// less than 5 ms on average and none running has run longer; for
	// longer tasks only as many as its slots finish during one claim's
	// round trip (Concurrency × claim time / task time, rounded down: none
	// for tasks much longer than a claim), and none while a running task
	// has run four times the average. A task so held waits about one
	// claim's round trip, no longer than it would take to claim it, so a
	// worker does not sit on tasks that others could run. A task waiting
	// for a slot is cancelled like a running one and handed back
	// unstarted on Stop.
	Prefetch int
	// TTL of the worker's lease when Lease is nil (default 10 s): a dead
	// worker's tasks are claimable again about this long after it died.
	TTL   time.Duration
	Lease *lease.Lease
	// Timeout bounds one attempt of a task that sets none (default 30 m).
	Timeout time.Duration
	// BackoffBase and BackoffMax shape retry delays: a random delay up to
	// min(BackoffMax, BackoffBase*2^(attempt-1)) (full jitter). Defaults 1 s
	// and 5 m; a task may override both.
	BackoffBase, BackoffMax time.Duration
	// Drain makes Run return once the queue has nothing pending, running
	// or retrying, and no scheduled task that is due, paused or not: it
	// does not wait for tasks scheduled to run later, and on a paused queue
	// with tasks pending it waits for the resume.
	Drain bool
	// ShutdownTimeout is how long Run lets running tasks finish after its
	// context ends, before cancelling them and handing them back (default
	// 30 s); and how long a handler whose context ended may take to
	// return before the worker gives up on it (ErrAbandoned).
	ShutdownTimeout time.Duration
	// Retention is how long tasks that succeeded or were cancelled are
	// kept; then the worker removes them (their counts stay in Stats).
	// Zero means DefaultRetention; negative keeps them for ever.
	Retention time.Duration
	// Gates admit each task before its handler runs, in order. Put those
	// that hand tasks back (concurrency quotas, circuit breakers) before
	// those that wait (rate limits), as drover worker does (package flow).
	Gates []Gate
	// DepthInterval is how often the worker counts the queue's tasks by
	// state for the drover_queue_tasks metric; 0 never (counting walks
	// the queue's keys in etcd, so keep it to seconds).
	DepthInterval time.Duration
	Logger        *slog.Logger
	// TracerProvider makes the spans of the worker's attempts (and of the
	// submissions of its client); nil means the global provider
	// (otel.GetTracerProvider), a no-op unless set. See package tracing.
	TracerProvider trace.TracerProvider
}

// Validate reports the first field that is not usable.
func (c WorkerConfig) Validate() error {
	if _, err := keyspace.New(c.Namespace); err != nil {
		return err
	}
	if err := CheckQueue(c.Queue); err != nil {
		return err
	}
	if c.WorkerID != "" {
		if err := keyspace.CheckName("worker id", c.WorkerID); err != nil {
			return err
		}
	}
	switch {
	case c.Concurrency < 0 || c.Concurrency > 10000:
		return &drover.InputError{Field: "concurrency", Value: c.Concurrency, Rule: "must be between 1 and 10000"}
	case c.Prefetch < 0 || c.Prefetch > 100:
		return &drover.InputError{Field: "prefetch", Value: c.Prefetch, Rule: "must be between 1 and 100"}
	case c.Timeout < 0, c.BackoffBase < 0, c.BackoffMax < 0, c.ShutdownTimeout < 0:
		return &drover.InputError{Field: "timeout/backoff/shutdown timeout", Rule: "must not be negative"}
	}
	if c.Lease == nil && c.TTL != 0 {
		return lease.CheckTTL("ttl", c.TTL)
	}
	return nil
}

// WorkerStats counts what a worker did.
type WorkerStats struct {
	Claimed    int64 `json:"claimed"`
	Succeeded  int64 `json:"succeeded"`
	Retried    int64 `json:"retried"`
	Dead       int64 `json:"dead"`
	HandedBack int64 `json:"handed_back"`
	Fenced     int64 `json:"fenced"`
	InFlight   int64 `json:"in_flight"`
}

// Worker claims tasks of one queue and runs their handlers.
type Worker struct {
	cfg       WorkerConfig
	cli       *clientv3.Client
	keys      keyspace.Space
	client    *Client
	lease     *lease.Lease
	ownsLease bool
	worker    string
	logger    *slog.Logger
	// spans makes the spans of its attempts (startAttempt).
	spans *otelspan.Consumer

	mu       sync.Mutex
	handlers map[string]Handler
	fallback Handler
	inflight map[string]*running
	// stuck counts the handlers given up on that still run (at most
	// Concurrency, see runHandler); stuckFreed is closed, and replaced,
	// whenever one of them returns.
	stuck      int
	stuckFreed chan struct{}
	// finishing are the writes of done to the streams of tasks whose
	// outcomes were stored (finishStreams): Run waits for them.
	finishing sync.WaitGroup

	succeeded, retried, dead, handedBack, fenced atomic.Int64
	taskTime                                     atomic.Int64 // a running average of how long tasks take, in ns (sample)
	claimTime                                    atomic.Int64 // a running average of how long claims take, in ns (sample)

	// sched picks the segments and tasks to claim, and claims them.
	sched *claimer
	// allAhead makes aheadHeld hold no slot back, whatever the measured
	// times: set by tests, before Run, to make a claim take tasks ahead.
	allAhead bool

	// The lifecycle: Run once; Stop and StopAndCancel end it, before or
	// after it started, any number of times.
	lifeMu   sync.Mutex
	started  bool
	stopReq  chan struct{}   // closed by the first Stop or StopAndCancel
	ending   <-chan struct{} // closed once Run's ctx ends or Stop is called (set by Run)
	stopOnce sync.Once
	ran      chan struct{} // closed when Run returns
	hardStop atomic.Bool   // StopAndCancel: running tasks are cancelled and handed back
}

type running struct {
	cancel  context.CancelCauseFunc
	token   int64     // the claim's create revision
	runKey  string    // the run's key, for a task claimed from a segment
	started time.Time // when its handler started (zero: claimed ahead, waiting)
}

// claimValue is what a claim key holds.
type claimValue struct {
	Worker    string    `json:"w"`
	Attempt   int       `json:"a"`
	ClaimedAt time.Time `json:"t"`
}

// NewWorker returns a worker; register handlers, then call Run.
func NewWorker(ctx context.Context, cli *clientv3.Client, cfg WorkerConfig) (*Worker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 8
	}
	if cfg.Prefetch == 0 {
		cfg.Prefetch = min(cfg.Concurrency, 100)
	}
	if cfg.TTL == 0 {
		cfg.TTL = 10 * time.Second
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 30 * time.Minute
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = time.Second
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = 5 * time.Minute
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = 30 * time.Second
	}
	if cfg.Retention == 0 {
		cfg.Retention = DefaultRetention
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	client, err := NewClient(cli, cfg.Namespace, WithTracerProvider(cfg.TracerProvider))
	if err != nil {
		return nil, err
	}
	w := newWorker(client, cfg, cfg.Lease, lock.NewHolder(cfg.WorkerID).ID, logger)
	w.sched.shardCursor.Store(rand.Int64N(Shards)) // workers start on different shards
	if w.lease == nil {
		l, err := lease.Grant(ctx, cli, cfg.TTL, lease.WithLogger(logger))
		if err != nil {
			return nil, fmt.Errorf("queue: %w", err)
		}
		w.lease, w.ownsLease = l, true
		w.sched.lease = l
	}
	return w, nil
}

// newWorker is a worker of client's namespace with cfg (defaults applied),
// claiming under l as worker: every field set, so that NewWorker and the
// outcome writers of external workers (outcomeWorker) build the same
// thing.
func newWorker(client *Client, cfg WorkerConfig, l *lease.Lease, worker string, logger *slog.Logger) *Worker {
	return &Worker{cfg: cfg, cli: client.cli, keys: client.keys, client: client, lease: l, logger: logger, worker: worker,
		spans:   otelspan.NewConsumer(client.tracer, client.keys.Namespace(), cfg.Queue, worker),
		sched:   newClaimer(client, cfg.Queue, l, worker, logger),
		stopReq: make(chan struct{}), ran: make(chan struct{}),
		handlers: map[string]Handler{}, inflight: map[string]*running{}}
}

// Gate admits tasks before their handler runs: flow control (rate limits,
// concurrency quotas, circuit breakers) plugs in here.
type Gate interface {
	// Admit returns once t may run, with done to be called with the
	// handler's error after it ran. It returns ctx's error when ctx ends
	// first, or a *DeferError to hand t back for later without charging
	// it a retry.
	Admit(ctx context.Context, t *Task) (done func(err error), err error)
}

// DeferError hands a task back to its queue, to be claimed again after
// After, without counting the attempt. It is drover.DeferError, the one
// deferral of every part, so a flow control gate's refusal is one as it is.
type DeferError = drover.DeferError

// Handle registers h for tasks of type taskType.
func (w *Worker) Handle(taskType string, h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.handlers[taskType] = h
}

// HandleAll registers h for every task type without a handler of its own.
func (w *Worker) HandleAll(h Handler) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fallback = h
}

// Lease returns the lease the worker's claims are bound to.
func (w *Worker) Lease() *lease.Lease { return w.lease }

// ID returns the worker id recorded in claims and transitions.
func (w *Worker) ID() string { return w.worker }

// Stats returns what the worker has done so far.
func (w *Worker) Stats() WorkerStats {
	w.mu.Lock()
	n := int64(len(w.inflight))
	w.mu.Unlock()
	return WorkerStats{Claimed: w.sched.claimed.Load(), Succeeded: w.succeeded.Load(), Retried: w.retried.Load(), Dead: w.dead.Load(),
		HandedBack: w.handedBack.Load(), Fenced: w.fenced.Load(), InFlight: n}
}

// Close revokes the worker's own lease first (any claim still held is
// released at once), then ends its queue client's shared watches, waited
// for within ctx. Call it after Run returns; it is safe to call twice.
func (w *Worker) Close(ctx context.Context) error {
	var err error
	if w.ownsLease {
		err = w.lease.Close(ctx)
	}
	return errors.Join(err, w.client.Close(ctx))
}

// claimed is a task this worker holds.
type claim struct {
	task       *Task
	recRev     int64
	claimKey   string
	pendingKey string
	token      int64
	claimedAt  time.Time
	broken     error // the claimed task cannot run: it goes to the DLQ
	// run is the run of a task claimed from a segment (claimKey is its
	// key), with the task's slot; nil for a task with a record of its own.
	run  *segRun
	slot int
	// claimed is the task as claimed, kept by the first restore.
	claimed *Task
}

// restore sets c's task back to the task as claimed (keeping it the first
// time), so that an outcome's writes are built from it however often.
func (c *claim) restore() {
	if c.claimed == nil {
		t := *c.task
		t.Transitions = slices.Clone(t.Transitions)
		c.claimed = &t
		return
	}
	*c.task = *c.claimed
	c.task.Transitions = slices.Clone(c.claimed.Transitions)
}

// outcome is how an attempt ended, to be written by the acker.
type outcome struct {
	c      *claim
	kind   Status // Succeeded, Retrying, Dead, Sleeping, or Pending (handed back)
	result []byte
	err    error
	delay  time.Duration
	until  time.Time  // when a Sleeping task falls due
	repark bool       // a Sleeping or Waiting task that ran nothing, parked again
	wait   *task.Wait // what a Waiting task waits for (until: its due time)
	// deferred is why flow control handed the task back (with delay), ""
	// otherwise.
	deferred   string
	deferLabel string // deferred's label in drover_tasks_deferred_total ("": up to its first ": ")
	// streamed: the task's stream may have events, so its end (Succeeded,
	// Dead) closes it with Done: done, in the outcome's transaction
	// (stream.Attempt.DoneOp), or once the outcome is stored.
	streamed bool
	done     []clientv3.Op
	spend    *spending // the signals an external worker's outcome consumes (brokerreport.go)
}

// compares hold while claim c is held: its key (the task's claim, or
// its run) has c's token as create revision, and, for a task of a run,
// its slot has not left the segment.
func (w *Worker) compares(c *claim) []clientv3.Cmp {
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(c.claimKey), "=", c.token)}
	if c.run != nil {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(w.keys.Exit(w.cfg.Queue, c.run.seg, c.slot)), "=", 0))
	}
	return cmps
}

// Compares are the compares of the claim's fence: a stream.Fence, so
// that a task's stream is written under its claim in transactions
// shared with other streams.
func (f *claimFence) Compares() []clientv3.Cmp { return f.w.compares(f.c) }

var _ stream.Fence = (*claimFence)(nil)

// beginStream starts the attempt of claim f at its task's stream: the
// handler's stream.Emit writes there. A retry, or a step resumed after a
// sleep or a wait (neither costs an attempt), may follow events of an
// attempt before.
func (w *Worker) beginStream(ctx context.Context, f *claimFence) (context.Context, *stream.Attempt) {
	t := f.c.task
	resumed := slices.ContainsFunc(t.Transitions, func(tr Transition) bool { return tr.Status == Sleeping || tr.Status == Waiting })
	return stream.Begin(ctx, w.cli, w.keys, stream.Claim{Task: t.ID, Attempt: t.Attempt, Worker: w.worker, Fence: f}, t.Attempt > 1 || resumed)
}

// endStream closes the attempt's events with AttemptEnded and its
// outcome, under its claim, before the outcome is written; the outcome
// of a task that ended carries its Done (o.done), stored with it or not
// at all: a worker that dies before it leaves a task that runs again
// with followers still following. Without it (the end was not written),
// Done follows the stored outcome (finishStreams). A claim already lost
// writes nothing (the next attempt marks the boundary, or the
// canceller writes Done). It sets whether the stream may have events.
func (w *Worker) endStream(ctx context.Context, at *stream.Attempt, o *outcome) {
	name := outcomeName(o.kind)
	switch o.kind {
	case Cancelled:
		o.streamed = at.Touched() // the claim is gone: the canceller or the next attempt closes it
		return
	case Pending:
		name = "handed back"
	}
	if err := at.End(ctx, stream.AttemptEnded, name, o.err); err != nil {
		w.logger.Debug("queue: the end of an attempt was not written to its stream", "task", o.c.task.ID, "err", err)
	}
	o.streamed = at.Touched()
	if op, ok := at.DoneOp(name, truncate(errText(o.err), 4096)); ok && (o.kind == Succeeded || o.kind == Dead) {
		o.done = []clientv3.Op{op}
	}
}

// finishStreams closes with Done the streams of the tasks whose end
// (ended, stored) ended them, fenced by the stream alone.
func (w *Worker) finishStreams(ended []outcome) {
	ctx, cancel := context.WithTimeout(w.cli.Ctx(), 10*time.Second)
	defer cancel()
	sw := stream.For(w.cli, w.keys)
	for _, o := range ended {
		if err := sw.Finish(ctx, o.c.task.ID, outcomeName(o.kind), errText(o.err)); err != nil {
			w.logger.Debug("queue: the done of a task was not written to its stream", "task", o.c.task.ID, "err", err)
		}
	}
}

// ErrAbandoned is the error of an attempt whose handler did not return
// within the worker's ShutdownTimeout after its context ended: the worker
// gave up waiting for it, freed its slot, and decided the attempt by why
// the context ended. Whatever the handler returns later is discarded.
var ErrAbandoned = errors.New("queue: handler did not return after its context ended; abandoned")

// errAttemptOver refuses the writes made through an attempt's claim fence
// once the attempt is over (claimFence.gone).
var errAttemptOver = errors.New("queue: the attempt is over (its handler returned or was abandoned); it writes no more")

// handled is what a handler returned.
type handled struct {
	result []byte
	err    error
}

// runHandler runs h for t in a goroutine of its own and waits for it to
// return, but not for ever: once hctx ended (timeout, cancel, lost claim,
// lease lost, shutdown) the handler has ShutdownTimeout to return, and
// then the worker gives up on it. It counts and logs the abandoned
// handler, and returns ErrAbandoned with hctx's cause, so that the
// attempt's outcome is decided as if the handler had returned that: its
// slot is freed and the task is handed back or left to whoever holds it
// now. The handler's late result is dropped; its writes through the
// claim's fence are refused (execute marks the fence gone before the
// outcome is written). finish gets what the handler returned once it
// returned, late or not (the flow control gates keep their slot until
// then).
//
// At most Concurrency handlers are given up on at once: with that many
// still running, the worker waits for this one as it did before giving
// up was possible (its slot stays taken; logged at error level) until it
// or one of the others returns, or the worker stops (stopping): then it
// gives up on it too, over the cap, so that Run and Stop return.
func (w *Worker) runHandler(hctx context.Context, h Handler, t *Task, finish func(error)) ([]byte, error) {
	// The handler gets a copy of the task: an abandoned one may read it
	// while the outcome writer rewrites the claim's.
	ht := *t
	ht.Transitions = slices.Clone(t.Transitions)
	done := make(chan handled, 1)
	go func() {
		result, err := call(hctx, h, &ht)
		done <- handled{result, err}
	}()
	select {
	case r := <-done:
		finish(r.err)
		return r.result, r.err
	case <-hctx.Done():
	}
	grace := time.NewTimer(w.cfg.ShutdownTimeout)
	defer grace.Stop()
	select {
	case r := <-done:
		finish(r.err)
		return r.result, r.err
	case <-grace.C:
	}
	for logged := false; ; logged = true {
		freed, ok := w.reserveStuck()
		if ok {
			break
		}
		if !logged {
			w.logger.Error("queue: a handler did not return after its context ended, and as many handlers as the worker's concurrency were given up on already and still run; waiting for it (its slot stays taken) until it or one of them returns",
				"queue", t.Queue, "task", t.ID, "type", t.Type, "attempt", t.Attempt, "stuck", w.cfg.Concurrency)
		}
		select {
		case r := <-done:
			finish(r.err)
			return r.result, r.err
		case <-freed:
		case <-w.ending:
		case <-w.lease.Context().Done():
		}
	}
	cause := context.Cause(hctx)
	metrics.HandlersAbandoned.WithLabelValues(t.Queue, t.Type).Inc()
	stuck := metrics.HandlersStuck.WithLabelValues(t.Queue)
	stuck.Inc()
	w.logger.Error("queue: a handler did not return after its context ended; the worker gave up on it (its goroutine still runs, its result will be discarded)",
		"queue", t.Queue, "task", t.ID, "type", t.Type, "attempt", t.Attempt, "token", t.Token, "cause", cause, "waited", w.cfg.ShutdownTimeout)
	// The claim's task is the outcome writer's from here on (a hand-back
	// rewrites its attempt): the late return logs copies.
	q, id, attempt := t.Queue, t.ID, t.Attempt
	go func() {
		r := <-done // the late result: dropped
		finish(r.err)
		stuck.Dec()
		w.releaseStuck()
		w.logger.Warn("queue: an abandoned handler returned; its result was discarded", "queue", q, "task", id, "attempt", attempt)
	}()
	return nil, fmt.Errorf("%w: %w", ErrAbandoned, cause)
}

// reserveStuck counts one more handler given up on, unless Concurrency of
// them still run and the worker is not stopping: then it returns false
// and a channel closed once one of them returns.
func (w *Worker) reserveStuck() (<-chan struct{}, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stuckFreed == nil {
		w.stuckFreed = make(chan struct{})
	}
	if w.stuck >= w.cfg.Concurrency && !w.stopping() {
		return w.stuckFreed, false
	}
	w.stuck++
	return nil, true
}

// releaseStuck counts a handler given up on that returned.
func (w *Worker) releaseStuck() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stuck--
	if w.stuckFreed != nil {
		close(w.stuckFreed)
		w.stuckFreed = make(chan struct{})
	}
}
